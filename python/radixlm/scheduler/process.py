"""The scheduler process: ModelRunner + Scheduler, fed over ZMQ.

Started as `python -m radixlm.scheduler.process ARGS_JSON ENDPOINTS_JSON [TP_RANK]` (a fresh
interpreter: no fork of a threaded parent, no re-import of the user's __main__). Its first
message downstream is SchedulerReady, or the start-up error, so the parent fails fast with the
real reason.

With `--tp-size N` there are N of these, one per rank, joined by torch.distributed. Only rank 0
talks ZMQ: each scheduler iteration, what it received is broadcast to the other ranks, so every
rank runs the same schedule on its shard of the model, and only rank 0 sends outputs.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import traceback
from concurrent.futures import ThreadPoolExecutor

import zmq

from radixlm import envs
from radixlm.config import ServerArgs
from radixlm.managers import ipc
from radixlm.managers.messages import SchedulerReady, ShutdownReq
from radixlm.utils.gc_freeze import freeze_startup_heap
from radixlm.utils.phases import PhaseTimer, seconds_since_spawn

logger = logging.getLogger(__name__)

# Messages taken per scheduler iteration: a burst of large requests (a 256-prompt batch) starts
# its first prefill after the first of them are unpickled and admitted, and the rest are read
# in the next iterations while that prefill runs.
MESSAGES_PER_STEP = 64


def run_scheduler_process(args: ServerArgs, endpoints: ipc.IpcEndpoints,
                          tp_rank: int = 0) -> bool:
    """Returns False if start-up failed (the process then exits with code 1)."""
    ipc.die_with_parent()
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"[%(asctime)s]{f' TP{tp_rank}' if args.tp_size > 1 else ''} "
                               "%(name)s: %(message)s")
    first = tp_rank == 0
    ctx = zmq.Context()
    inbox = ipc.pull_socket(ctx, endpoints.scheduler) if first else None
    outbox = ipc.push_socket(ctx, endpoints.detokenizer) if first else None

    def send(msg) -> None:
        if outbox is not None:
            ipc.send(outbox, msg)

    startup = PhaseTimer()
    spawned = seconds_since_spawn()
    if spawned is not None:
        startup.seconds["process_start"] = spawned
    try:
        with startup.phase("imports"):
            from radixlm.distributed.parallel_state import init_tensor_parallel
            from radixlm.mem_cache.hiradix_cache import HiCacheConfig
            from radixlm.model_executor.light_tokenizer import (load_ids_tokenizer,
                                                                load_light_tokenizer)
            from radixlm.model_executor.model_runner import create_runner_and_kv
            from radixlm.model_executor.runner_config import RunnerConfig
            from radixlm.model_executor.weight_source import (load_tokenizer,
                                                              set_trust_remote_code)
            from radixlm.scheduler.config import SchedulerConfig
            from radixlm.scheduler.scheduler import Scheduler

        # The scheduler only encodes and decodes (stop strings, jump-forward): where
        # tokenizer.json gives transformers' answers it is read directly (~0.15 s, no
        # transformers import; model_executor/light_tokenizer.py). Otherwise
        # transformers' tokenizer (seconds of imports) loads on a thread meanwhile, only when
        # nothing is left to convert (a GGUF conversion imports transformers too, outside the
        # loader's lock). While that thread runs, the interpreter switches threads every 0.1 ms
        # instead of 5: each CUDA call of the graph capture that lets the GIL go would otherwise
        # wait up to 5 ms for the importing thread to hand it back (the capture took 8-20 s
        # instead of 2 on an H200).
        set_trust_remote_code(args.trust_remote_code)
        tokenizer_path = None if args.skip_tokenizer_init else \
            (args.tokenizer_path or args.model_path)
        tokenizer_job, switch_interval = None, sys.getswitchinterval()
        converted = args.model_path and os.path.isfile(os.path.join(args.model_path,
                                                                    "config.json"))
        with startup.phase("tokenizer"):
            light_tokenizer = (load_light_tokenizer(tokenizer_path)
                               if converted and tokenizer_path else None)
        if (light_tokenizer is None and converted and tokenizer_path
                and os.path.isfile(os.path.join(tokenizer_path, "tokenizer_config.json"))):
            sys.setswitchinterval(1e-4)
            tokenizer_job = ThreadPoolExecutor(1, "tokenizer").submit(load_tokenizer,
                                                                      tokenizer_path)
        runner_config = RunnerConfig.from_server_args(args, tp_rank)
        on_gpu = _on_gpu(args)
        if args.tp_size > 1 and not on_gpu:   # the ranks share the CPU's cores
            import torch
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // args.tp_size))
        with startup.phase("device_and_ranks"):
            if on_gpu:   # the CUDA context, here rather than inside whichever phase comes first
                import torch
                local_gpu = envs.local_gpu()
                if local_gpu is not None:   # a TP rank: its node's GPUs are all visible
                    torch.cuda.set_device(local_gpu)
                torch.zeros(1, device="cuda")
            if args.nnodes > 1:   # (the other nodes may not be up yet: say what we wait for)
                logger.info("TP rank %d of %d: waiting for the ranks of all %d nodes at %s",
                            tp_rank, args.tp_size, args.nnodes, args.dist_init_addr)
            tp = init_tensor_parallel(tp_rank, args.tp_size, args.dist_init_addr or "",
                                      "cuda" if on_gpu else "cpu", args.dist_timeout,
                                      custom_all_reduce=(not args.disable_custom_all_reduce
                                                         and args.nnodes == 1))

        def recv(timeout_s):   # rank 0 reads the socket; every rank gets the same messages
            return tp.broadcast_from_first(
                ipc.recv_all(inbox, timeout_s, MESSAGES_PER_STEP) if first else None)

        hicache = (HiCacheConfig.from_server_args(args, tp_rank)
                   if args.enable_hierarchical_cache else None)
        if hicache is not None and tp.size > 1:
            hicache = dataclasses.replace(hicache, agree_on_blocks=tp.min_over_ranks)
        draft_model = None
        if args.speculative_algorithm == "STANDALONE":   # first: its weights use the budget
            from radixlm.scheduler.draft_model import DraftModel
            with startup.phase("draft_model"):
                draft_model = DraftModel.load(args)
            runner_config = dataclasses.replace(
                runner_config, draft_kv_bytes_per_token=draft_model.kv_bytes_per_token)
        runner, kv = create_runner_and_kv(runner_config, radix=not args.disable_radix_cache,
                                          hicache=hicache)
        if draft_model is not None:
            draft_model.attach(runner, kv)
        startup.merge(runner.startup)
        with startup.phase("tokenizer"):   # (a thread's: what is left of it)
            tokenizer = light_tokenizer or (
                tokenizer_job.result() if tokenizer_job is not None else
                None if args.skip_tokenizer_init else load_ids_tokenizer(runner.tokenizer_path))
        sys.setswitchinterval(switch_interval)
        with startup.phase("scheduler"):
            scheduler = Scheduler(SchedulerConfig.from_server_args(args), runner, kv, recv,
                                  send, tokenizer, draft_model)
        logger.info("scheduler ready: %s", startup.summary())
        mc = runner.model_config
        send(SchedulerReady(
            max_total_num_tokens=runner.max_total_num_tokens,
            max_running_requests=runner.max_running_requests, context_len=mc.context_len,
            vocab_size=mc.vocab_size, eos_token_ids=list(mc.eos_token_ids),
            device=str(runner.device), dtype=str(runner.dtype).removeprefix("torch."),
            model_path=runner.hf_dir, tokenizer_path=runner.tokenizer_path,
            speculative=scheduler.speculator is not None, startup_phases=startup.seconds,
            all_reduce_paths=tp.all_reduce_paths(),
            max_prompt_tokens=scheduler.kv_capacity - 1))
    except Exception as e:
        if isinstance(e, ValueError):   # what the flags or the model ask cannot be: no trace
            logger.error("scheduler start-up failed: %s", e)
        else:
            logger.error("scheduler start-up failed:\n%s", traceback.format_exc())
        flag_error = isinstance(e, ValueError) and str(e).startswith("--")
        send(SchedulerReady(0, 0, 0, 0, [], "", "", "", "",
                            error=str(e) if flag_error else f"{type(e).__name__}: {e}",
                            flag_error=flag_error))
        if outbox is not None:
            outbox.close()
        ctx.term()
        return False
    frozen = freeze_startup_heap()   # (no full collection pass in the serving loop)
    logger.debug("froze %d start-up objects", frozen)
    try:
        scheduler.run_forever()
    except Exception:
        logger.error("scheduler crashed:\n%s", traceback.format_exc())
        raise
    finally:
        kv.prefix_cache.close()   # e.g. the file tier's writes still queued
        send(ShutdownReq())  # after everything else: the detokenizer stops too
        for sock in (outbox, inbox):
            if sock is not None:
                sock.close()
        ctx.term()
    return True


def _on_gpu(args: ServerArgs) -> bool:
    if args.device is not None:
        return args.device.startswith("cuda")
    import torch
    return torch.cuda.is_available()


if __name__ == "__main__":
    started = run_scheduler_process(ServerArgs(**json.loads(sys.argv[1])),
                                    ipc.IpcEndpoints(**json.loads(sys.argv[2])),
                                    int(sys.argv[3]) if len(sys.argv) > 3 else 0)
    # Everything is sent and closed: skip the interpreter's teardown of torch and friends,
    # which takes seconds and only delays the server's shutdown.
    ipc.exit_now(0 if started else 1)
