"""ZMQ plumbing between the engine's processes, and the parent-death guard of child processes.

Every channel is a PUSH -> PULL pair over an ipc:// socket in a private temp directory; messages
are the dataclasses of messages.py, pickled.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
import pickle
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import zmq


@dataclass(frozen=True)
class IpcEndpoints:
    scheduler: str      # tokenizer manager -> scheduler
    detokenizer: str    # scheduler -> detokenizer
    tokenizer: str      # detokenizer -> tokenizer manager

    @classmethod
    def create(cls) -> "IpcEndpoints":
        sweep_stale_dirs()
        d = tempfile.mkdtemp(prefix=IPC_DIR_PREFIX)
        with open(os.path.join(d, OWNER_FILE), "w") as f:
            f.write(str(os.getpid()))
        return cls(*(f"ipc://{os.path.join(d, name)}"
                     for name in ("scheduler", "detokenizer", "tokenizer")))


IPC_DIR_PREFIX = "radixlm-ipc-"
OWNER_FILE = "owner"     # the pid of the process that made the directory (and removes it)


def sweep_stale_dirs() -> None:
    """Remove the socket directories of engines that are gone without removing their own (a
    SIGKILL): each names its owner's pid, and a directory whose owner no longer runs is
    stale. Directories without an owner file, or of another user, are left alone."""
    base = tempfile.gettempdir()
    for name in os.listdir(base):
        if not name.startswith(IPC_DIR_PREFIX):
            continue
        path = os.path.join(base, name)
        try:
            with open(os.path.join(path, OWNER_FILE)) as f:
                owner = int(f.read())
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except (OSError, ValueError):   # no owner file, not ours to signal, unreadable
            continue


def pull_socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PULL)
    sock.bind(endpoint)
    return sock


def push_socket(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 5000)  # deliver what was sent before close (e.g. a start-up error)
    sock.connect(endpoint)
    return sock


def send(sock: zmq.Socket, msg: Any) -> None:
    sock.send(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))


def recv_all(sock: zmq.Socket, timeout_s: float | None, limit: int | None = None) -> list[Any]:
    """Every message waiting on sock (at most `limit`); waits up to timeout_s for the first
    (0/None: no wait)."""
    msgs: list[Any] = []
    if timeout_s and not sock.poll(int(timeout_s * 1000)):
        return msgs
    while limit is None or len(msgs) < limit:
        try:
            msgs.append(pickle.loads(sock.recv(zmq.NOBLOCK)))
        except zmq.Again:
            return msgs
    return msgs


def exit_now(code: int) -> None:
    """End a child process at once, after flushing its logs and standard streams."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def die_with_parent(parent: int | None = None) -> None:
    """Make this child process exit when its parent dies, even by SIGKILL: the kernel's
    parent-death signal where available, plus a watchdog thread polling the parent pid.
    `parent`: the pid the parent gave; if it is already gone (the child was re-parented before
    getting here), exit now."""
    if parent is not None and os.getppid() != parent:
        os._exit(0)
    parent = os.getppid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        PR_SET_PDEATHSIG = 1
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux: the watchdog alone

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()
    # Ctrl-C in a terminal reaches the whole process group; the parent coordinates shutdown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
