"""The engine's socket directories: each names its owner, and one whose owner is gone (killed
by SIGKILL before it could remove it) is swept when the next engine starts."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from radixlm.managers import ipc


def test_stale_directories_are_swept_and_live_ones_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def made(name: str, owner: int | None) -> str:
        path = tmp_path / f"{ipc.IPC_DIR_PREFIX}{name}"
        path.mkdir()
        (path / "scheduler").write_text("")
        if owner is not None:
            (path / ipc.OWNER_FILE).write_text(str(owner))
        return str(path)

    stale, live, unknown = made("stale", dead.pid), made("live", os.getpid()), made("old", None)
    other = tmp_path / "not-ours"
    other.mkdir()
    endpoints = ipc.IpcEndpoints.create()
    mine = os.path.dirname(endpoints.tokenizer.removeprefix("ipc://"))
    assert not os.path.exists(stale)
    assert os.path.isdir(live) and os.path.isdir(unknown) and other.is_dir()
    assert open(os.path.join(mine, ipc.OWNER_FILE)).read() == str(os.getpid())
