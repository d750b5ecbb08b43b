"""Starting the scheduler processes of this node's tensor-parallel ranks, and running a node
other than node 0 (`radixlm serve --nnodes N --node-rank K`, K > 0).

The --tp-size ranks are spread evenly over --nnodes machines: node K runs ranks
K*per_node .. (K+1)*per_node - 1, rank i on its GPU --base-gpu-id + (i - K*per_node). Node 0
also runs the HTTP server, the tokenizer and the detokenizer, and its rank 0 receives the
requests and broadcasts them; the other nodes only run their ranks, which exit when rank 0 tells
them to (or when this process dies).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

from radixlm import envs
from radixlm.config import ServerArgs
from radixlm.managers import ipc
from radixlm.utils.gpus import node_env, pinned_env, visible_gpus
from radixlm.utils.phases import SPAWN_TIME_ENV


def start_ranks(args: ServerArgs, endpoints: ipc.IpcEndpoints
                ) -> list[tuple[str, subprocess.Popen]]:
    """One scheduler process per rank of this node; raises ValueError (naming the flag) when
    the node has fewer GPUs than ranks."""
    per_node = args.tp_size // args.nnodes
    # One rank on the first GPU keeps this process's environment and needs no count: counting
    # without CUDA_VISIBLE_DEVICES imports torch here (seconds), before the scheduler starts.
    one_on_first = args.tp_size == 1 and args.base_gpu_id == 0
    gpus = 0 if args.device == "cpu" or one_on_first else len(visible_gpus())
    if gpus and args.base_gpu_id + per_node > gpus:
        raise ValueError(f"--tp-size {args.tp_size} over --nnodes {args.nnodes} puts {per_node} "
                         f"ranks on this node from --base-gpu-id {args.base_gpu_id}: "
                         f"{args.base_gpu_id + per_node} GPUs needed, {gpus} visible")
    # (without the API key: only the HTTP process checks it, and a child's argv is readable by
    # every local user through ps)
    args_json = json.dumps(dataclasses.asdict(dataclasses.replace(args, api_key=None)))
    ep = json.dumps(dataclasses.asdict(endpoints))
    procs = []
    for local in range(per_node):
        rank = args.node_rank * per_node + local
        gpu = args.base_gpu_id + local
        if args.tp_size > 1 and gpus:
            # The ranks see all of this node's ranks' GPUs (peer-to-peer NVLink needs the peer
            # visible) and each picks its own (envs.local_gpu).
            env = node_env(args.base_gpu_id, per_node)
            env[envs.LOCAL_GPU] = str(local)
        else:   # one rank: it sees only its GPU, which is then simply `cuda`
            env = pinned_env(gpu) if gpu and gpus else dict(os.environ)
        envs.keep_multicast_off(env)
        env[SPAWN_TIME_ENV] = repr(time.time())   # the child reports its interpreter start-up
        name = "scheduler" if args.tp_size == 1 else f"scheduler (TP rank {rank})"
        procs.append((name, subprocess.Popen(
            [sys.executable, "-m", "radixlm.scheduler.process", args_json, ep, str(rank)],
            env=env)))
    return procs


def run_follower_node(args: ServerArgs) -> int:
    """Node K > 0: run this node's ranks until they exit. SIGTERM / Ctrl-C stops them."""
    from radixlm.model_executor.weight_source import resolve_model_dir

    # As the Engine does on node 0: the ranks start from one resolved (downloaded, converted)
    # directory.
    hf_dir, load_format = resolve_model_dir(args.model_path, args.load_format, args.revision,
                                            args.download_dir)
    args = dataclasses.replace(args, model_path=hf_dir, load_format=load_format)
    procs = start_ranks(args, ipc.IpcEndpoints.create())   # (they talk no ZMQ)
    print(f"radixlm node {args.node_rank} of {args.nnodes}: {len(procs)} tensor-parallel ranks, "
          f"joining at {args.dist_init_addr}", file=sys.stderr, flush=True)

    def stop(sig, frame) -> None:
        for _, p in procs:
            if p.poll() is None:
                p.kill()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, stop)
    codes = []
    for name, p in procs:
        while p.poll() is None:
            time.sleep(0.2)
            if any(q.poll() not in (None, 0) for _, q in procs):
                stop(None, None)   # one rank failed: the others cannot go on
        codes.append(p.returncode)
    return max(codes, default=0)
