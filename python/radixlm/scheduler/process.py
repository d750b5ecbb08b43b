"""The scheduler process: ModelRunner + Scheduler, fed over ZMQ.

Started as `python -m radixlm.scheduler.process ARGS_JSON ENDPOINTS_JSON` (a fresh interpreter:
no fork of a threaded parent, no re-import of the user's __main__). Its first message downstream
is SchedulerReady, or the start-up error, so the parent fails fast with the real reason.
"""

from __future__ import annotations

import logging
import traceback
import json
import sys

import zmq

from radixlm.config import ServerArgs
from radixlm.managers import ipc
from radixlm.managers.messages import SchedulerReady, ShutdownReq

logger = logging.getLogger(__name__)


def run_scheduler_process(args: ServerArgs, endpoints: ipc.IpcEndpoints) -> None:
    ipc.die_with_parent()
    logging.basicConfig(level=args.log_level.upper(), format="[%(asctime)s] %(name)s: %(message)s")
    ctx = zmq.Context()
    inbox = ipc.pull_socket(ctx, endpoints.scheduler)
    outbox = ipc.push_socket(ctx, endpoints.detokenizer)
    try:
        from radixlm.model_executor.model_runner import create_runner_and_kv
        from radixlm.model_executor.runner_config import RunnerConfig
        from radixlm.model_executor.weight_source import load_tokenizer
        from radixlm.scheduler.config import SchedulerConfig
        from radixlm.scheduler.scheduler import Scheduler

        runner, kv = create_runner_and_kv(RunnerConfig.from_server_args(args),
                                          radix=not args.disable_radix_cache)
        tokenizer = load_tokenizer(runner.tokenizer_path)
        scheduler = Scheduler(SchedulerConfig.from_server_args(args), runner, kv,
                              lambda t: ipc.recv_all(inbox, t), lambda m: ipc.send(outbox, m),
                              tokenizer)
        mc = runner.model_config
        ipc.send(outbox, SchedulerReady(
            max_total_num_tokens=runner.max_total_num_tokens,
            max_running_requests=runner.max_running_requests, context_len=mc.context_len,
            vocab_size=mc.vocab_size, eos_token_ids=list(mc.eos_token_ids),
            device=str(runner.device), dtype=str(runner.dtype).removeprefix("torch."),
            model_path=runner.hf_dir, tokenizer_path=runner.tokenizer_path))
    except Exception as e:
        logger.error("scheduler start-up failed:\n%s", traceback.format_exc())
        ipc.send(outbox, SchedulerReady(0, 0, 0, 0, [], "", "", "", "",
                                       error=f"{type(e).__name__}: {e}"))
        outbox.close()
        ctx.term()
        return
    try:
        scheduler.run_forever()
    except Exception:
        logger.error("scheduler crashed:\n%s", traceback.format_exc())
        raise
    finally:
        ipc.send(outbox, ShutdownReq())  # after everything else: the detokenizer stops too
        outbox.close()
        inbox.close()
        ctx.term()


if __name__ == "__main__":
    run_scheduler_process(ServerArgs(**json.loads(sys.argv[1])),
                          ipc.IpcEndpoints(**json.loads(sys.argv[2])))
    # Everything is sent and closed: skip the interpreter's teardown of torch and friends,
    # which takes seconds and only delays the server's shutdown.
    ipc.exit_now(0)
