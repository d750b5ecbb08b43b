"""`radixlm serve --dp-size N`: N engines, each a `radixlm serve` child on a private port (one
per GPU from `--base-gpu-id` on a GPU machine; all on the CPU otherwise), and the cache-aware
router in this process on `--port`.

Process hygiene as for one server: SIGTERM / Ctrl-C stops every engine (each stops its own
scheduler and detokenizer, its requests ending through the router), then the router; an engine
that dies stops the server with exit code 1 (router/server.run_router). The engines run with
RADIXLM_DIE_WITH_PARENT=<this pid> and so exit if this process dies, even by SIGKILL. The API
key reaches them through the environment (RADIXLM_API_KEY), not their command lines.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from radixlm.config import ServerArgs
from radixlm.router.config import RouterArgs
from radixlm.utils.server_process import check_port_free, free_port, stop_server, wait_healthy

ENGINE_START_TIMEOUT_S = 900


def engine_gpus(args: ServerArgs) -> list[int | None]:
    """The visible-GPU index each engine is pinned to (None: CPU)."""
    if args.device == "cpu":
        return [None] * args.dp_size
    from radixlm.utils.gpus import visible_gpus
    count = len(visible_gpus())
    if count == 0:
        if args.device is not None:
            raise ValueError(f"--device {args.device}: no GPU is visible")
        return [None] * args.dp_size
    need = args.base_gpu_id + args.dp_size * args.tp_size   # each engine: --tp-size GPUs
    if need > count:
        raise ValueError(f"--dp-size {args.dp_size} x --tp-size {args.tp_size} from "
                         f"--base-gpu-id {args.base_gpu_id} needs {need} GPUs; {count} are "
                         f"visible")
    return [args.base_gpu_id + i * args.tp_size for i in range(args.dp_size)]


def _start_engines(args: ServerArgs, gpus: list[int | None]) -> list[tuple[subprocess.Popen, str]]:
    engines = []
    env = {**os.environ, "RADIXLM_DIE_WITH_PARENT": str(os.getpid())}
    if args.api_key:
        env["RADIXLM_API_KEY"] = args.api_key
    for gpu in gpus:
        port = free_port()
        flags = args.to_cli_args(dp_size=1, port=port, host="127.0.0.1",
                                 base_gpu_id=gpu or 0, api_key=None, dist_init_addr=None)
        proc = subprocess.Popen([sys.executable, "-m", "radixlm.cli", "serve", *flags],
                                env=env, start_new_session=True)
        engines.append((proc, f"http://127.0.0.1:{port}"))
    return engines


def serve_dp(args: ServerArgs) -> int:
    from radixlm.router.server import run_router

    if args.nnodes > 1:
        raise ValueError("--dp-size: with --nnodes > 1 start the engines on each machine and "
                         "put `radixlm router` in front of them")
    gpus = engine_gpus(args)
    check_port_free(args.host, args.port)    # before minutes of engine start-up
    router_args = RouterArgs(host=args.host, port=args.port, api_key=args.api_key,
                             log_level=args.log_level)   # validated before any engine starts

    def stop_on_signal(sig, frame):  # while the engines start: stop them, then leave
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, stop_on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    engines: list[tuple[subprocess.Popen, str]] = []
    try:
        started = time.perf_counter()
        engines = _start_engines(args, gpus)
        for proc, url in engines:
            wait_healthy(proc, url, ENGINE_START_TIMEOUT_S, headers=(
                {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None))
        print(f"radixlm: {len(engines)} engines ready in {time.perf_counter() - started:.1f} s "
              f"({', '.join(url for _, url in engines)})", file=sys.stderr, flush=True)
        for s, handler in previous.items():
            signal.signal(s, handler)
        return run_router(RouterArgs(**{**router_args.__dict__,
                                        "worker_urls": [url for _, url in engines]}),
                          info_overrides={"dp_size": args.dp_size, "host": args.host,
                                          "port": args.port},
                          engines=[proc for proc, _ in engines])
    except KeyboardInterrupt:
        return 130
    except RuntimeError as e:
        print(f"radixlm serve: {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        for proc, _ in engines:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in engines:
            stop_server(proc, timeout_s=30)
