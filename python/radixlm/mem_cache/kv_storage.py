"""The hierarchical cache's third tier (L3): KV blocks in a store that outlives the server.

A block is the KV of `block_size` consecutive tokens at a block-aligned position, in every
layer. It is named by a hash chained over the token ids from the start of the sequence (and a
namespace: the model, its KV layout, the tensor-parallel rank), so the same prefix always maps to
the same names: a restarted server, or another server on the same store, finds them.

`KVStorage` is the interface (get / set / exists by name); `FileStorage` keeps one file per
block in a directory. Each file carries a checksum of its payload: a corrupt or truncated file
is a miss (counted), never wrong KV. A write that fails (disk full, ...) is dropped and counted;
serving goes on. Writes run on a background thread, behind the request that produced them;
reads can run on others ahead of need (`StoragePrefetcher`: when a request arrives, the
blocks its prompt may find are read, straight into page-locked staging memory, and checksummed
while it waits for admission).
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import queue
import shutil
import tempfile
import threading
import time
import zlib
from abc import ABC, abstractmethod
from array import array
from collections import OrderedDict
from dataclasses import dataclass
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Callable, Collection, Sequence

from radixlm.mem_cache.staging_arena import StagingArena

logger = logging.getLogger(__name__)

@dataclass(frozen=True)
class _FileFormat:
    """A block file: `magic`, the payload's checksum (`digest_bytes`), the payload."""
    magic: bytes
    digest_bytes: int
    checksum: Callable[[Sequence[memoryview]], bytes]

    @property
    def head(self) -> int:
        return len(self.magic) + self.digest_bytes


def _crc32(pieces: Sequence[memoryview]) -> bytes:
    crc = 0
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
    return crc.to_bytes(4, "little")


def _sha256(pieces: Sequence[memoryview]) -> bytes:
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return digest.digest()


# Written now: CRC32. It catches a corrupt or truncated file as SHA-256 did for this purpose
# (errors, not attacks), and the prefetch threads read 8k tokens of 8B KV (1 GiB) in 80-92 ms
# instead of 147-161 ms on an H200 host (the checksum was the reads' largest cost). Files of
# earlier builds (SHA-256) are still read.
FILE_FORMAT = _FileFormat(b"RLMKV2", 4, _crc32)
_READ_FORMATS = {f.magic: f for f in (FILE_FORMAT, _FileFormat(b"RLMKV1", 32, _sha256))}
MAGIC_BYTES = 6               # every format's magic has this length
_MAX_HEAD = max(f.head for f in _READ_FORMATS.values())


def _iov_max() -> int:
    """How many buffers one preadv call may take."""
    try:
        return max(1, os.sysconf("SC_IOV_MAX"))
    except (AttributeError, ValueError, OSError):
        return 1024


_IOV_MAX = _iov_max()


def _read_exactly(fd: int, views: Sequence[memoryview], offset: int) -> bool:
    """Fill `views` in order from file descriptor `fd` at `offset`, with one preadv call for
    many views where the platform has it (a syscall a block, not a piece); False at an early
    end of file."""
    todo = [v.cast("B") for v in views if v.nbytes]     # (a short read is counted in bytes)
    while todo:
        batch = todo[:_IOV_MAX]
        if hasattr(os, "preadv"):
            n = os.preadv(fd, batch, offset)
        else:
            os.lseek(fd, offset, os.SEEK_SET)
            n = os.readv(fd, batch)
        if n <= 0:
            return False
        offset += n
        while n:                    # (drop what was filled; keep a partly filled view's rest)
            if n >= todo[0].nbytes:
                n -= todo.pop(0).nbytes
            else:
                todo[0], n = todo[0][n:], 0
    return True


def block_names(namespace: str, tokens: Sequence[int], block_size: int) -> list[str]:
    """The name of each whole block of `tokens`: block i's name hashes every token before its
    end (chained: block i's hash covers block i-1's). Tokens are hashed as 8-byte integers,
    packed once for the whole key (a decimal string per token cost 2.7x as much: 1.2 ms for
    an 8k-token key, paid at a request's arrival and at each match and insert)."""
    names, h = [], hashlib.sha256(namespace.encode()).digest()
    data = array("q", tokens).tobytes()
    step = block_size * 8
    for end in range(step, len(tokens) // block_size * step + 1, step):
        h = hashlib.sha256(h + data[end - step:end]).digest()
        names.append(h.hex())
    return names


class KVStorage(ABC):
    @abstractmethod
    def get(self, name: str) -> bytes | None:
        """The block's bytes, or None (absent, unreadable or corrupt)."""

    @abstractmethod
    def set(self, name: str, data: bytes) -> bool:
        """Store a block; False if that failed (counted and dropped, not raised)."""

    @abstractmethod
    def exists(self, name: str) -> bool: ...

    def remove(self, name: str) -> None:
        """Drop a block if stored (a store that cannot leaves it: this is housekeeping)."""

    def set_pieces(self, name: str, pieces: Sequence[memoryview]) -> bool:
        """Store a block whose bytes are `pieces` in order (the staging arena's rows). A store
        that can write them without joining them overrides this (FileStorage)."""
        return self.set(name, b"".join(pieces))

    def get_into(self, name: str, pieces: Sequence[memoryview]) -> bool:
        """Read the block into `pieces` (writable byte views whose lengths add up to its
        size, filled in order); False if it is absent, unreadable, corrupt or of another size.
        A store that can read in place overrides this (FileStorage: no bytes object)."""
        data = self.get(name)
        if data is None or len(data) != sum(p.nbytes for p in pieces):
            return False
        view, pos = memoryview(data), 0
        for piece in pieces:
            piece[:] = view[pos:pos + piece.nbytes]
            pos += piece.nbytes
        return True


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
        self._count_lock = threading.Lock()     # (prefetch threads count at once)

    def _broken(self, name: str) -> None:
        """A file that failed its checks is counted and removed, so that the block is written
        again (the writer skips names whose file exists): left in place, a file cut short by a
        crash would be a miss for every server on the directory, forever."""
        with self._count_lock:
            self.corrupt += 1
        try:
            os.unlink(self._path(name))
        except OSError:
            pass

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name[:2], name + ".kv")

    def exists(self, name: str) -> bool:
        # (a file: anything else at a block's path, say a directory, is written over by set)
        return os.path.isfile(self._path(name))

    def remove(self, name: str) -> None:
        try:
            os.unlink(self._path(name))
        except OSError:
            pass

    def get(self, name: str) -> bytes | None:
        try:
            with open(self._path(name), "rb") as f:
                blob = f.read()
        except OSError:
            return None
        fmt = _READ_FORMATS.get(blob[:MAGIC_BYTES])
        if fmt is None or len(blob) < fmt.head or (
                fmt.checksum([memoryview(blob)[fmt.head:]]) != blob[MAGIC_BYTES:fmt.head]):
            self._broken(name)
            return None
        return blob[fmt.head:]

    def get_into(self, name: str, pieces: Sequence[memoryview]) -> bool:
        """The payload read straight into `pieces` (the staging arena's rows: no bytes object,
        no copy past the header); the checksum is taken over them piece by piece. preadv, zlib
        and hashlib let go of the GIL, so prefetch threads read blocks in parallel."""
        size = sum(p.nbytes for p in pieces)
        try:
            fd = os.open(self._path(name), os.O_RDONLY)
        except OSError:
            return False
        head = memoryview(bytearray(_MAX_HEAD))
        try:
            fmt = (_READ_FORMATS.get(bytes(head[:MAGIC_BYTES]))
                   if _read_exactly(fd, [head[:MAGIC_BYTES]], 0) else None)
            if (fmt is None or os.fstat(fd).st_size != fmt.head + size
                    or not _read_exactly(fd, [head[MAGIC_BYTES:fmt.head], *pieces],
                                         MAGIC_BYTES)):
                self._broken(name)
                return False
        except OSError:
            return False
        finally:
            os.close(fd)
        if fmt.checksum(pieces) != bytes(head[MAGIC_BYTES:fmt.head]):
            self._broken(name)
            return False
        return True

    def set(self, name: str, data: bytes) -> bool:
        return self.set_pieces(name, [memoryview(data)])

    def set_pieces(self, name: str, pieces: Sequence[memoryview]) -> bool:
        """The header, then the pieces as they are: no joined copy (the copies a bytes payload
        cost were made holding the GIL, 8 MiB a block of an 8B model)."""
        path = self._path(name)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)   # (not a block: it would stay a miss forever)
            checksum = FILE_FORMAT.checksum(pieces)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(FILE_FORMAT.magic + checksum)
                    for piece in pieces:
                        f.write(piece)
                os.replace(tmp, path)   # readers see the whole file or none
                return True
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        except OSError as e:
            self.failed_writes += 1
            logger.warning("KV block not stored (%s): %s", e.strerror or e, path)
            return False


class BackgroundWriter:
    """Runs `storage.set` / `set_pieces` on a thread so that disk writes never hold up a step.
    A write queued beyond `max_pending` writes or `max_pending_bytes` is dropped (the block is
    simply not stored). The data may be a function that returns the bytes or a list of pieces,
    called on the writer's thread (the file tier's: it waits there for the device -> staging
    copy, not on the scheduler's thread)."""

    def __init__(self, storage: KVStorage, max_pending: int = 1024,
                 max_pending_bytes: int = 1 << 30,
                 on_failed: Callable[[str], None] | None = None):
        """`on_failed(name)`: called on the writer's thread for a write that failed (the
        file tier then offers the block again the next time its key is cached)."""
        self.storage = storage
        self.on_failed = on_failed
        self.pending: queue.Queue = queue.Queue(max_pending)
        self.max_pending_bytes = max_pending_bytes
        self.pending_bytes = 0
        self.dropped = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name="kv-storage-writer", daemon=True).start()

    def has_room(self, nbytes: int) -> bool:
        """Whether a write of nbytes would be queued now (not dropped)."""
        with self._lock:
            return self._fits(nbytes) and not self.pending.full()

    def _fits(self, nbytes: int) -> bool:
        # (one write larger than the bound is queued when nothing else is)
        return self.pending_bytes + nbytes <= self.max_pending_bytes or not self.pending_bytes

    def submit(self, name: str, data: bytes | Callable[[], bytes | Sequence[memoryview]],
               nbytes: int | None = None, finished: Callable[[], None] | None = None) -> bool:
        """Queue a write (`nbytes`: the size of what a function `data` makes: bytes, or pieces
        written in order); False if it was dropped (the queue is full). `finished` is called
        on the writer's thread once the write is done or failed (not if it was dropped)."""
        if isinstance(data, bytes):
            size = len(data)
        elif nbytes is None:
            raise ValueError("a write whose bytes a function makes needs its nbytes")
        else:
            size = nbytes
        with self._lock:
            if not self._fits(size):
                self.dropped += 1
                return False
            self.pending_bytes += size
        try:
            self.pending.put_nowait((name, data, size, finished))
        except queue.Full:
            with self._lock:
                self.pending_bytes -= size
                self.dropped += 1
            return False
        return True

    def flush(self) -> None:
        """Wait until everything submitted is written (tests, shutdown)."""
        self.pending.join()

    def _run(self) -> None:
        while True:
            name, data, size, finished = self.pending.get()
            stored = True
            try:
                if not self.storage.exists(name):
                    payload = data if isinstance(data, bytes) else data()
                    stored = (self.storage.set_pieces(name, payload)
                              if isinstance(payload, (list, tuple))
                              else self.storage.set(name, bytes(payload)))
            except Exception:     # (a failed device copy: the block is not stored)
                logger.exception("KV block %s not stored", name)
                stored = False
            finally:
                with self._lock:    # (first: `finished` frees room a submit may take at once)
                    self.pending_bytes -= size
                for callback, arg in ((self.on_failed if not stored else None, (name,)),
                                      (finished, ())):
                    if callback is not None:
                        try:
                            callback(*arg)
                        except Exception:   # (the thread must live on: flush() waits for it)
                            logger.exception("KV storage writer callback failed")
                self.pending.task_done()


# A block read ahead and not taken for this long is dropped when room is needed: its request
# went away or found the prefix elsewhere (a request that waits longer reads it again).
PREFETCH_STALE_S = 60.0


@dataclass
class _RequestReads:
    """What the reads of one request's blocks share: the index of the first block not read
    (missing, or no room in the arena); blocks after it are not read."""
    stop_at: float = math.inf


class StoragePrefetcher:
    """Reads blocks from a store into a staging arena (staging_arena.py) on threads of its own,
    ahead of the match that needs them, so that the scheduler's thread finds them in page-locked
    memory instead of waiting for the disk and the checksum (a block of an 8B model is 8 MiB to
    read and hash) while a batch could be scheduled. A request's blocks are read by `threads`
    threads at once (preadv and the checksum let go of the GIL); once one is missing, or
    the arena has no free block, the request's later blocks not yet started are not read (names
    are chained: nothing after a miss can match), and the match reads the rest itself. A block
    read and not yet taken holds its arena block; one never taken gives way after
    PREFETCH_STALE_S when room is needed, or when a match needs room (`give_way`)."""

    def __init__(self, storage: KVStorage, arena: StagingArena, threads: int = 4):
        self.storage = storage
        self.arena = arena
        self.held = 0             # arena blocks read ahead and not yet taken
        self.taken = 0            # blocks the match found read ahead (metrics, tests)
        self._lock = threading.Lock()
        # name -> (its read: an arena block, or None for absent or corrupt; when it was queued)
        self._reads: OrderedDict[str, tuple[Future, float]] = OrderedDict()
        self._tasks: set[Future] = set()
        self._closed = False
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="kv-storage-prefetch")

    def prefetch(self, names: Sequence[str]) -> None:
        """Queue the reads of consecutive blocks `names` (the caller goes on)."""
        now, request = time.monotonic(), _RequestReads()
        with self._lock:
            for i, name in enumerate(names):
                if name in self._reads:
                    continue
                read: Future = Future()
                self._reads[name] = (read, now)
                task = self._threads.submit(self._read, name, i, read, request)
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    def take(self, name: str) -> int | None:
        """The arena block holding `name` if it was read ahead (now the caller's to release),
        waiting for its read if that is queued or under way (the prefetch threads read a
        request's blocks in parallel, faster than the caller would one by one); None if it
        was not, or was found absent or corrupt: the caller reads it itself."""
        with self._lock:
            entry = self._reads.pop(name, None)
        if entry is None or entry[0].cancelled():
            return None
        block = entry[0].result()
        if block is not None:
            with self._lock:
                self.held -= 1
                self.taken += 1
        return block

    def give_way(self, keep: Collection[str] = ()) -> int | None:
        """The arena block of the most recently queued block read ahead and not taken (a
        request further back in the queue reads it again), none named in `keep`: now the
        caller's (handed over, not freed, so that no prefetch thread can take it first).
        None if there is none."""
        with self._lock:
            for name in reversed(self._reads):
                read = self._reads[name][0]
                if name in keep or not read.done() or read.result() is None:
                    continue
                del self._reads[name]
                self.held -= 1
                return read.result()
        return None

    def wait_idle(self) -> None:
        """Wait until every queued read is done (tests)."""
        while self._tasks:
            wait(list(self._tasks))

    def close(self) -> None:
        """Stop: reads not started are called off, blocks held go back to the arena, and
        `take` finds nothing from now on."""
        self._threads.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            reads, self._reads = list(self._reads.values()), OrderedDict()
            self._closed = True
            for read, _ in reads:
                if not read.cancel() and read.done() and read.result() is not None:
                    self.held -= 1
                    self.arena.release([read.result()])

    def _read(self, name: str, index: int, read: Future, request: "_RequestReads") -> None:
        if not read.set_running_or_notify_cancel():
            return                                  # (close called it off)
        block = None
        try:
            with self._lock:
                skip = index > request.stop_at
                if not skip and self.arena.available() == 0:
                    self._drop_stale()
            block = None if skip else self.arena.acquire()
            if block is not None and not self.storage.get_into(name, self.arena.pieces(block)):
                self.arena.release([block])
                block = None
        except Exception:       # (a store that raises: a miss here, the match reads it itself)
            logger.exception("prefetching KV block %s failed", name)
            if block is not None:
                self.arena.release([block])
                block = None
        finally:
            with self._lock:
                if block is None:
                    # A miss, or no room: the request's later blocks are not read.
                    request.stop_at = min(request.stop_at, index)
                    if self._reads.get(name, (None,))[0] is read:
                        del self._reads[name]   # (a block written later is read then)
                elif self._closed:
                    self.arena.release([block])
                    block = None
                else:
                    self.held += 1
                # (always, and under the lock: `take` may be waiting for it, and a `close`
                # between the count and the result would find it neither done nor cancelable)
                read.set_result(block)

    def _drop_stale(self) -> None:
        """Free the blocks read more than PREFETCH_STALE_S ago and never taken (lock held)."""
        now = time.monotonic()
        for name, (read, queued) in list(self._reads.items()):
            if now - queued < PREFETCH_STALE_S:
                break
            if read.done():
                del self._reads[name]
                if read.result() is not None:
                    self.held -= 1
                    self.arena.release([read.result()])
