"""The hierarchical cache's third tier (L3): KV blocks in a store that outlives the server.

A block is the KV of `block_size` consecutive tokens at a block-aligned position, in every
layer. It is named by a hash chained over the token ids from the start of the sequence (and a
namespace: the model, its KV layout, the tensor-parallel rank), so the same prefix always maps to
the same names: a restarted server, or another server on the same store, finds them.

`KVStorage` is the interface (get / set / exists by name); `FileStorage` keeps one file per
block in a directory. Each file carries a checksum of its payload: a corrupt or truncated file
is a miss (counted), never wrong KV. A write that fails (disk full, ...) is dropped and counted;
serving goes on. Writes run on a background thread, behind the request that produced them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import tempfile
import threading
from abc import ABC, abstractmethod
from typing import Sequence

logger = logging.getLogger(__name__)

MAGIC = b"RLMKV1"
DIGEST = 32   # sha256


def block_names(namespace: str, tokens: Sequence[int], block_size: int) -> list[str]:
    """The name of each whole block of `tokens`: block i's name hashes every token before its
    end (chained: block i's hash covers block i-1's)."""
    names, h = [], hashlib.sha256(namespace.encode()).digest()
    for end in range(block_size, len(tokens) + 1, block_size):
        chunk = ",".join(map(str, tokens[end - block_size:end])).encode()
        h = hashlib.sha256(h + chunk).digest()
        names.append(h.hex())
    return names


class KVStorage(ABC):
    @abstractmethod
    def get(self, name: str) -> bytes | None:
        """The block's bytes, or None (absent, unreadable or corrupt)."""

    @abstractmethod
    def set(self, name: str, data: bytes) -> None:
        """Store a block (a failure is counted and dropped, not raised)."""

    @abstractmethod
    def exists(self, name: str) -> bool: ...


class FileStorage(KVStorage):
    def __init__(self, directory: str):
        directory = os.path.abspath(os.path.expanduser(directory))
        try:
            os.makedirs(directory, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=directory):
                pass
        except OSError as e:
            raise ValueError(f"--hicache-storage-dir: {directory} is not a writable "
                             f"directory ({e.strerror or e})") from None
        self.directory = directory
        self.corrupt = 0          # files that failed their checksum (counted as misses)
        self.failed_writes = 0

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name[:2], name + ".kv")

    def exists(self, name: str) -> bool:
        return os.path.exists(self._path(name))

    def get(self, name: str) -> bytes | None:
        try:
            with open(self._path(name), "rb") as f:
                blob = f.read()
        except OSError:
            return None
        head = len(MAGIC) + DIGEST
        if (len(blob) < head or not blob.startswith(MAGIC)
                or hashlib.sha256(blob[head:]).digest() != blob[len(MAGIC):head]):
            self.corrupt += 1
            return None
        return blob[head:]

    def set(self, name: str, data: bytes) -> None:
        path = self._path(name)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(MAGIC + hashlib.sha256(data).digest() + data)
                os.replace(tmp, path)   # readers see the whole file or none
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError as e:
            self.failed_writes += 1
            logger.warning("KV block not stored (%s): %s", e.strerror or e, path)


class BackgroundWriter:
    """Runs `storage.set` on a thread so that disk writes never hold up a step; a full queue
    drops the write (the block is simply not stored)."""

    def __init__(self, storage: KVStorage, max_pending: int = 1024):
        self.storage = storage
        self.pending: queue.Queue = queue.Queue(max_pending)
        self.dropped = 0
        threading.Thread(target=self._run, name="kv-storage-writer", daemon=True).start()

    def submit(self, name: str, data: bytes) -> None:
        try:
            self.pending.put_nowait((name, data))
        except queue.Full:
            self.dropped += 1

    def flush(self) -> None:
        """Wait until everything submitted is written (tests, shutdown)."""
        self.pending.join()

    def _run(self) -> None:
        while True:
            name, data = self.pending.get()
            try:
                if not self.storage.exists(name):
                    self.storage.set(name, data)
            finally:
                self.pending.task_done()
