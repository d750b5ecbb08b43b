"""Starting and stopping `radixlm serve` as a child process (benchmarks and tests).

The server runs in its own process group, so stopping it (SIGTERM, then SIGKILL of the group)
leaves none of its scheduler or detokenizer processes behind.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

import httpx


def check_port_free(host: str, port: int) -> None:
    """Raises ValueError naming --port when it cannot be bound on `host`, or --host when that
    does not resolve (checked before the model loads: a server that cannot listen should not
    take a minute to say so)."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port,
                                                          type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: {e.strerror or e}") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # (as the server binds it)
        try:
            s.bind(addr)
        except OSError as e:
            raise ValueError(f"--port {port} on {host}: {e.strerror or e}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_server(args: Sequence[str], timeout_s: float,
                  poll_s: float = 0.5) -> tuple[subprocess.Popen, str]:
    """`radixlm serve --port <free port> ARGS`; returns (process, base url) once /health answers.
    Raises RuntimeError (after stopping it) if the server exits or is not healthy in time."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "radixlm.cli", "serve", "--port", str(port),
                             *args], start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(proc, url, timeout_s, poll_s)
    return proc, url


def wait_healthy(proc: subprocess.Popen, url: str, timeout_s: float, poll_s: float = 0.5,
                 headers: dict[str, str] | None = None) -> None:
    """Return once `url`/health answers 200. Raises RuntimeError (after stopping the process)
    if it exits or is not healthy in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode} during start-up")
        try:
            if httpx.get(url + "/health", timeout=2, headers=headers).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll_s)
    stop_server(proc)
    raise RuntimeError(f"server did not become healthy in {timeout_s:.0f} s")


def stop_server(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout_s: float = 30) -> int:
    """Send `sig`; SIGKILL the whole process group if it has not exited after timeout_s."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode
