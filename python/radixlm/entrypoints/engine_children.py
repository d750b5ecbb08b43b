"""The Engine's child processes: the scheduler ranks (one per tensor-parallel rank) and the
detokenizer, their start-up handshake, crash detection that names the child that died, and an
orderly stop."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import zmq

from radixlm.config import ServerArgs
from radixlm.managers import ipc
from radixlm.managers.messages import SchedulerReady, ShutdownReq
from radixlm.entrypoints.ranks import start_ranks
from radixlm.utils.server_process import free_port

_START_TIMEOUT_S = 600
_RANK0_ERROR_GRACE_S = 15   # after another child died at start-up, for rank 0's own error


class EngineChildren:
    """The scheduler processes (one per tensor-parallel rank) and the detokenizer, and the
    sockets to reach them."""

    def __init__(self, args: ServerArgs, tokenizer_path: str):
        self.endpoints = ipc.IpcEndpoints.create()
        if args.tp_size > 1 and args.dist_init_addr is None:
            args = dataclasses.replace(args, dist_init_addr=f"127.0.0.1:{free_port()}")
        self.ctx = zmq.Context()
        # Bind our inbox before the children start so nothing they send is lost.
        self.inbox = ipc.pull_socket(self.ctx, self.endpoints.tokenizer)
        self.to_scheduler = ipc.push_socket(self.ctx, self.endpoints.scheduler)
        try:
            self.processes: list[tuple[str, subprocess.Popen]] = start_ranks(args,
                                                                             self.endpoints)
        except ValueError:   # too few GPUs for the ranks: nothing was started
            self._close_sockets()
            raise
        ep = json.dumps(dataclasses.asdict(self.endpoints))
        self.processes.append(("detokenizer", subprocess.Popen(
            [sys.executable, "-m", "radixlm.managers.detokenizer_process",
             "" if args.skip_tokenizer_init else tokenizer_path, ep,
             args.log_level, str(int(args.trust_remote_code))])))
        self._send_lock = threading.Lock()
        self._shutdown_sent = False

    def wait_ready(self) -> SchedulerReady:
        deadline = time.monotonic() + _START_TIMEOUT_S
        while time.monotonic() < deadline:
            for msg in ipc.recv_all(self.inbox, 0.2):
                if isinstance(msg, SchedulerReady):
                    return msg
            if (reason := self.dead_child()) is not None:
                # Rank 0's own error, if it is on its way, says more than "rank 1 exited". It
                # comes through the detokenizer, which may still be importing its tokenizer
                # (seconds on a loaded machine): wait for it while the detokenizer lives.
                grace = time.monotonic() + _RANK0_ERROR_GRACE_S
                while time.monotonic() < grace and self.processes[-1][1].poll() is None:
                    for msg in ipc.recv_all(self.inbox, 0.2):
                        if isinstance(msg, SchedulerReady) and msg.error is not None:
                            return msg
                return failed_start(f"{reason} during start-up (see its log above)")
        return failed_start(f"start-up took longer than {_START_TIMEOUT_S} s")

    def send(self, msg: Any) -> None:
        with self._send_lock:  # zmq sockets are not thread-safe
            ipc.send(self.to_scheduler, msg)

    def dead_child(self, grace_s: float = 5.0) -> str | None:
        """Why the children cannot go on: the first that exited. A detokenizer that exited
        cleanly was stopped by a scheduler on its way down (e.g. a lost tensor-parallel peer
        broke a collective): that scheduler's exit, once it comes (up to `grace_s`), is the
        reason given."""
        dead = [(name, proc) for name, proc in self.processes if proc.poll() is not None]
        if not dead:
            return None
        name, proc = dead[0]
        if name == "detokenizer" and proc.returncode == 0:
            deadline = time.monotonic() + grace_s
            schedulers = self.processes[:-1]
            while time.monotonic() < deadline:
                gone = [(n, p) for n, p in schedulers if p.poll() is not None]
                if gone:
                    name, proc = gone[0]
                    break
                time.sleep(0.05)
        return f"the {name} process exited with code {proc.returncode}"

    def request_shutdown(self) -> None:
        """Ask the scheduler to abort everything and exit (it then stops the detokenizer)."""
        if not self._shutdown_sent and self.processes[0][1].poll() is None:
            self._shutdown_sent = True
            self.send(ShutdownReq())

    def kill(self) -> None:
        for _, proc in self.processes:
            if proc.poll() is None:
                proc.kill()

    def stopped_on_request(self) -> bool:
        """Whether every child that has exited did so as asked: code 0, or ended by SIGTERM /
        SIGINT (a service manager stopping every process at once), not a crash or a kill."""
        asked = {0, -signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM, 128 + signal.SIGINT}
        return all(proc.returncode in asked for _, proc in self.processes
                   if proc.poll() is not None)

    def reap(self, timeout_s: float = 5.0) -> None:
        """Wait for killed children, so that none is left a zombie."""
        for _, proc in self.processes:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                pass

    def stop(self, timeout_s: float = 20.0) -> None:
        self.request_shutdown()
        for _, proc in self.processes:
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._close_sockets()

    def _close_sockets(self) -> None:
        self.to_scheduler.close(linger=0)  # the scheduler is gone: nothing left to deliver
        self.inbox.close()
        self.ctx.term()
        self.remove_socket_dir()

    def remove_socket_dir(self) -> None:
        """The private directory of the ipc:// sockets (tempfile.mkdtemp, never reused)."""
        shutil.rmtree(os.path.dirname(self.endpoints.tokenizer.removeprefix("ipc://")),
                      ignore_errors=True)


def failed_start(reason: str) -> SchedulerReady:
    return SchedulerReady(0, 0, 0, 0, [], "", "", "", "", error=reason)


