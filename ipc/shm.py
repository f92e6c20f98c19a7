"""POSIX shared-memory segments: naming, creation with reserved pages, attach with layout checks, stale recovery.

Theory of operation
-------------------
A segment is a file in /dev/shm (``posix_ipc`` + ``mmap``; never ``multiprocessing.shared_memory``, whose
resource tracker unlinks a segment when a process that merely attached exits, Python 3.11). The process that
creates a segment (the supervisor) owns its name and is the one that unlinks it; workers attach.

* **Names** are ``/<prefix>-<instance>-<kind>-<index>``: ``instance`` is a short stable hash of (real data path,
  node id), so two brokers on one host never collide and a restarted broker finds its own segments again.
* **Creation** uses O_CREAT|O_EXCL, then ``posix_fallocate`` reserves every page: a full /dev/shm fails here with
  ``SegmentError`` instead of delivering SIGBUS to whichever process first touches an unbacked page.
* **Header** (first page; the payload starts at ``PAYLOAD_OFFSET``, so ``.buf`` offsets start at 0):

      word: 0 magic 'NSQPYSEG' | 1 segment layout version | 2 payload size | 3 tag | 4 tag version
            5 creator pid | 6 creator start time (clock ticks since boot, guards against pid reuse) | 7 clean flag

  ``tag``/``tag version`` name what the payload holds (e.g. ``magic('NSQRINGS')``, 1), so ``attach`` refuses a
  segment of another kind or layout version with a clear ``LayoutError``. ``clean`` is 1 only after the owner
  called ``mark_clean()`` at an orderly shutdown; recovery code reads it.
* **Stale segments**: ``find_stale(prefix)`` lists ours whose creator is dead (pid gone or reused). They can be
  recovered (``attach`` then ``adopt()``, which makes this process the owner) or removed (``unlink_name``).

Resource handling: ``close()`` unmaps once no numpy view of ``.buf`` is alive (otherwise the mapping lives until
the last view is collected); ``unlink()`` removes the name (creator only); both are idempotent. A segment is also
a context manager that closes on exit (it does not unlink: the owner decides that).
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os

import numpy as np
import posix_ipc

from ipc.atomics import py_load_acquire
from ipc.layout import (HEADER_WORDS, H_MAGIC, H_PARAMS, H_SIZE, LayoutError, align_up, check_header, magic,
                        stamp_header, words)

__all__ = ["Segment", "MappedPayload", "reserve_and_map", "check_mapped_header", "SegmentError", "LayoutError", "segment_name", "instance_prefix", "find_stale",
           "list_segments", "unlink_name", "PREFIX", "PAYLOAD_OFFSET"]

PREFIX = "nsqpy"
SHM_DIR = "/dev/shm"
SEGMENT_MAGIC = magic("NSQPYSEG")
SEGMENT_VERSION = 1
PAYLOAD_OFFSET = mmap.PAGESIZE
_W = {name: H_PARAMS + k for k, name in enumerate(("tag", "tag_version", "pid", "start", "clean"))}
assert H_PARAMS + 5 == HEADER_WORDS


class SegmentError(OSError):
    """A segment cannot be created, reserved or found."""


def _hash(*parts) -> str:
    digest = hashlib.blake2b(digest_size=5)
    for part in parts:
        digest.update(str(part).encode() + b"\0")
    return digest.hexdigest()


def instance_prefix(data_path: str, node_id: int, prefix: str = PREFIX) -> str:
    """The name prefix shared by all segments of one broker instance (for ``find_stale``)."""
    return f"/{prefix}-{_hash(os.path.realpath(data_path), node_id)}-"


def segment_name(data_path: str, node_id: int, kind: str, index: int = 0, prefix: str = PREFIX) -> str:
    """``/<prefix>-<hash(data path, node id)>-<kind>-<index>``, stable across restarts."""
    if not kind.isidentifier():
        raise ValueError(f"segment kind must be an identifier, got {kind!r}")
    return f"{instance_prefix(data_path, node_id, prefix)}{kind}-{index}"


def _start_time(pid: int) -> int:
    """Start time of ``pid`` in clock ticks since boot, or -1 if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return -1
    return int(stat[stat.rindex(b")") + 2:].split()[19])  # field 22; the command name may hold spaces


def _alive(pid: int, start: int) -> bool:
    return pid > 0 and _start_time(pid) == start


class MappedPayload:
    """A mapping that starts with a layout header page, payload after it: what Segment (/dev/shm) and
    ipc.filesegment.FileSegment (disk) share. ``buf`` is a writable uint8 view of the payload."""

    def __init__(self, name: str, mapping: mmap.mmap):
        self.name = name
        self._map = mapping
        self._header = words(mapping, 0, HEADER_WORDS, f"segment {name}")
        self.size = int(self._header[H_SIZE])
        self.buf = np.frombuffer(mapping, dtype=np.uint8, count=self.size, offset=PAYLOAD_OFFSET)

    def close(self) -> None:
        """Unmap (deferred to the garbage collector while numpy views of ``buf`` are still alive); idempotent."""
        if self._map is None:
            return
        self.buf = self._header = None
        try:
            self._map.close()
        except BufferError:
            pass  # views of the payload are alive elsewhere; the mapping goes with the last of them
        self._map = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def reserve_and_map(fd: int, total: int, what: str, hint: str) -> mmap.mmap:
    """Size fd to ``total`` bytes, reserve every block (a full filesystem fails here, not later as SIGBUS in
    whichever process touches an unbacked page) and map it."""
    try:
        os.ftruncate(fd, total)
        os.posix_fallocate(fd, 0, total)
    except OSError as exc:
        raise SegmentError(exc.errno, f"cannot reserve {total} bytes for {what}: {os.strerror(exc.errno)} "
                                      f"({hint})") from exc
    return mmap.mmap(fd, total)


def check_mapped_header(mapping: mmap.mmap, magic_word: int, version: int, size, params, what: str,
                        names=None) -> None:
    """Check the header of an attached mapping; on a wrong layout close the mapping and raise LayoutError."""
    live = words(mapping, 0, HEADER_WORDS)
    py_load_acquire(live, H_MAGIC)  # orders the snapshot after the creator's publication of the magic
    snapshot = live.copy()  # checked on a copy, so an error's traceback pins no view of the mapping
    del live
    try:
        kwargs = {} if names is None else {"names": names}
        found = check_header(snapshot, magic_word, version, size, params, what=what, **kwargs)
        if PAYLOAD_OFFSET + found[0] > len(mapping):
            raise LayoutError(f"{what}: header claims {found[0]} payload bytes, file has "
                              f"{len(mapping) - PAYLOAD_OFFSET}")
    except LayoutError:
        mapping.close()
        raise


class Segment(MappedPayload):
    """One mapped segment. ``buf`` is a writable uint8 numpy array of the payload (offset 0 = first payload
    byte); ``size`` its length in bytes."""

    def __init__(self, name: str, mapping: mmap.mmap, owner: bool):
        super().__init__(name, mapping)
        self.owner = owner

    # life-cycle ---------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, size: int, tag: int = 0, tag_version: int = 0) -> "Segment":
        """Create, reserve and stamp a new segment of ``size`` payload bytes; fails if the name exists."""
        if size <= 0:
            raise ValueError("segment size must be positive")
        total = PAYLOAD_OFFSET + align_up(size, mmap.PAGESIZE)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
        except posix_ipc.ExistentialError as exc:
            raise SegmentError(errno.EEXIST, f"shared-memory segment {name} already exists "
                                             f"(stale? see ipc.shm.find_stale)") from exc
        try:
            mapping = reserve_and_map(shm.fd, total, f"{name} in {SHM_DIR}", "is /dev/shm full?")
        except BaseException:
            shm.unlink()
            raise
        finally:
            shm.close_fd()
        hdr = words(mapping, 0, HEADER_WORDS)
        pid = os.getpid()
        stamp_header(hdr, SEGMENT_MAGIC, SEGMENT_VERSION, size, (tag, tag_version, pid, _start_time(pid), 0))
        return cls(name, mapping, owner=True)

    @classmethod
    def attach(cls, name: str, size: int | None = None, tag: int | None = None,
               tag_version: int | None = None) -> "Segment":
        """Map an existing segment, checking magic, layout version and (when given) size, tag and tag version."""
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError as exc:
            raise SegmentError(errno.ENOENT, f"no shared-memory segment {name}") from exc
        try:
            if shm.size < PAYLOAD_OFFSET:
                raise LayoutError(f"segment {name}: {shm.size} bytes is too small to hold a segment header")
            mapping = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        check_mapped_header(mapping, SEGMENT_MAGIC, SEGMENT_VERSION, size, (tag, tag_version),
                            f"segment {name}", names=("tag", "tag version"))
        return cls(name, mapping, owner=False)

    def unlink(self) -> None:
        """Remove the name (the creating process does this); existing mappings stay valid."""
        unlink_name(self.name)

    # header fields -----------------------------------------------------------------------------------------
    @property
    def tag(self) -> tuple[int, int]:
        return int(self._header[_W["tag"]]), int(self._header[_W["tag_version"]])

    @property
    def creator_pid(self) -> int:
        return int(self._header[_W["pid"]])

    @property
    def clean(self) -> bool:
        return bool(self._header[_W["clean"]])

    def mark_clean(self, clean: bool = True) -> None:
        """Record an orderly shutdown (or, with False, that the payload is live again)."""
        self._header[_W["clean"]] = int(clean)

    def adopt(self) -> None:
        """Make this process the segment's owner (after recovering a stale segment)."""
        pid = os.getpid()
        self._header[_W["start"]] = _start_time(pid)
        self._header[_W["pid"]] = pid
        self.owner = True

    def creator_alive(self) -> bool:
        return _alive(int(self._header[_W["pid"]]), int(self._header[_W["start"]]))


def unlink_name(name: str) -> bool:
    """Remove a segment name; False if it did not exist."""
    try:
        posix_ipc.unlink_shared_memory(name)
        return True
    except posix_ipc.ExistentialError:
        return False


def list_segments(prefix: str = "/" + PREFIX) -> list[str]:
    """Names (with the leading '/') of the segments in /dev/shm that start with ``prefix``."""
    bare = prefix.lstrip("/")
    try:
        entries = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted("/" + e for e in entries if e.startswith(bare))


def find_stale(prefix: str = "/" + PREFIX) -> list[str]:
    """Our segments under ``prefix`` whose creator process is dead (or whose header is unreadable)."""
    stale = []
    for name in list_segments(prefix):
        try:
            seg = Segment.attach(name)
        except (LayoutError, SegmentError, ValueError):
            stale.append(name)  # not initialised or not ours: a creator died before stamping it
            continue
        try:
            if not seg.creator_alive():
                stale.append(name)
        finally:
            seg.close()
    return stale
