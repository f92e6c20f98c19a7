"""POSIX shared-memory segments: naming, creation with reserved pages, attach with layout checks, stale recovery.

Theory of operation
-------------------
A segment is a file in /dev/shm (``posix_ipc`` + ``mmap``; never ``multiprocessing.shared_memory``, whose
resource tracker unlinks a segment when a process that merely attached exits, Python 3.11). The process that
creates a segment (the supervisor) owns its name and is the one that unlinks it; workers attach.

* **Names** are ``/<prefix>-<instance>-<kind>-<index>``: ``instance`` is a short stable hash of (real data path,
  node id), so two brokers on one host never collide and a restarted broker finds its own segments again.
* **Creation** uses O_CREAT|O_EXCL, then ``posix_fallocate`` reserves every page: a full /dev/shm fails here with
  ``SegmentError`` instead of delivering SIGBUS to whichever process first touches an unbacked page (on tmpfs a
  read fault on a hole allocates a page too, so even a reader could be hit).
* **Sparse segments** (``reserve=``, the message log's data segments): the file is sized in full but only the
  header page and the first ``reserve`` payload bytes are reserved; the owner reserves more with
  ``reserve_range`` as it reaches them, and never touches a page it has not reserved. So a segment's cost in
  /dev/shm grows with its content, while every process still maps it whole at one address.
* **Layouts that grow in place** (``Segment.reserver()``: the broker's rings, in-flight tables and timer heaps): the
  segment is created with ``reserve=0`` and each layout reserves the bytes it touches, first its fixed part,
  then more as it grows, through a ``SegmentReserver``: ``reserver(offset, nbytes)`` reserves payload bytes
  [offset, offset + nbytes), reopening the segment by name (a child forked long after the segment was made
  needs no inherited fd), and raises SegmentError when /dev/shm cannot hold them. Reserving is idempotent, so a
  process killed between reserving and recording it only makes its successor reserve the same pages again.
  These are transport and bookkeeping, bounded by configuration, so they are not held to the safety reserve.
* **The /dev/shm safety reserve** (``check_shm_room``): what grows with traffic (log segments) must leave
  ``max(SHM_KEEP_FREE_MIN, SHM_KEEP_FREE_FRACTION of /dev/shm)`` free, so that control blocks (the broker's own at
  a restart, a new topic's) still find room when topics have filled the rest. Control blocks are not held to it.
* **Header** (first page; the payload starts at ``PAYLOAD_OFFSET``, so ``.buf`` offsets start at 0):

      word: 0 magic 'NSQPYSEG' | 1 segment layout version | 2 payload size | 3 tag | 4 tag version
            5 creator pid | 6 creator start time (clock ticks since boot, guards against pid reuse) | 7 clean flag

  ``tag``/``tag version`` name what the payload holds (e.g. ``magic('NSQRINGS')``, 1), so ``attach`` refuses a
  segment of another kind or layout version with a clear ``LayoutError``. ``clean`` is 1 only after the owner
  called ``mark_clean()`` at an orderly shutdown; recovery code reads it.
* **Stale segments**: ``find_stale(prefix)`` lists ours whose creator is dead (pid gone or reused). They can be
  recovered (``attach`` then ``adopt()``, which makes this process the owner) or removed (``unlink_name``).
* **Dead instances** (``find_dead_instances``): segments of every broker instance on the host, grouped by the
  instance part of their names. Liveness is decided per instance, never per segment: a live broker's topic logs
  are created by workers that may have died and been replaced since. An instance is alive while the process that
  created its ``control-0`` segment (the supervisor, which creates it first) is; a group whose control segment
  is unreadable, or that has none, is given ``INSTANCE_GRACE`` seconds from its newest file, since it may be
  starting right now. Inside a dead group, a segment whose own creator is alive is spared (an orphaned worker
  still using it, or a new instance of the same name warming up): removing is only ever for the dead.

Resource handling: ``close()`` unmaps once no numpy view of ``.buf`` is alive (otherwise the mapping lives until
the last view is collected); ``unlink()`` removes the name (creator only); both are idempotent. A segment is also
a context manager that closes on exit (it does not unlink: the owner decides that).
"""
from __future__ import annotations

import errno
import hashlib
import mmap
import os
import re
import time

import numpy as np
import posix_ipc

from nsqpy.ipc.atomics import py_load_acquire
from nsqpy.ipc.rawmap import map_fd
from nsqpy.ipc.layout import (HEADER_WORDS, H_MAGIC, H_PARAMS, H_SIZE, LayoutError, align_up, check_header, magic,
                        stamp_header, words)

__all__ = ["Segment", "MappedPayload", "SegmentProvider", "SegmentReserver", "reserve_and_map", "reserve_range",
           "check_mapped_header", "check_shm_room", "shm_keep_free", "open_segment_fd", "SegmentError", "LayoutError",
           "segment_name", "instance_prefix", "find_stale", "find_dead_instances", "remove_segments", "list_segments",
           "unlink_name", "own_start", "PREFIX", "PAYLOAD_OFFSET", "SHM_KEEP_FREE_MIN", "SHM_KEEP_FREE_FRACTION",
           "INSTANCE_GRACE"]

PREFIX = "nsqpy"
SHM_DIR = "/dev/shm"
SEGMENT_MAGIC = magic("NSQPYSEG")
SEGMENT_VERSION = 1
PAYLOAD_OFFSET = mmap.PAGESIZE
_W = {name: H_PARAMS + k for k, name in enumerate(("tag", "tag_version", "pid", "start", "clean"))}
assert H_PARAMS + 5 == HEADER_WORDS

# What log segments (which grow with traffic) must leave free in /dev/shm: control blocks are reserved in full and
# read by other processes, so the broker's own (at a restart) and a new topic's must still fit when the topics'
# messages have taken everything else; and a /dev/shm filled to the last page fails other programs on the host
# too. Read at every check, so tests may change them.
SHM_KEEP_FREE_MIN = 64 << 20
SHM_KEEP_FREE_FRACTION = 0.02
# A group of segments without a readable control segment may belong to a broker that is starting right now
# (warm-up segments come before control-0, and a segment is unreadable between its creation and its stamp).
INSTANCE_GRACE = 60.0
CONTROL_KIND = "control-0"  # created first by a broker's supervisor (workers/processes/plan.py), unlinked last


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


_OWN = (0, -1)  # (pid, start time) of this process, once read (a forked child reads its own)


def own_start() -> tuple[int, int]:
    """(pid, start time) of this process: /proc is read once per process, not for every segment it creates."""
    global _OWN
    pid = os.getpid()
    if _OWN[0] != pid:
        _OWN = (pid, _start_time(pid))
    return _OWN


def _alive(pid: int, start: int) -> bool:
    return pid > 0 and _start_time(pid) == start


class MappedPayload:
    """A mapping that starts with a layout header page, payload after it: what Segment (/dev/shm) and
    nsqpy.ipc.filesegment.FileSegment (disk) share. ``buf`` is a writable uint8 view of the payload."""

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
        _close_mapping(self._map)
        self._map = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def reserve_range(fd: int, offset: int, nbytes: int, what: str, hint: str) -> None:
    """Reserve the blocks of bytes [offset, offset + nbytes) of fd: a full filesystem fails here with
    SegmentError (tmpfs and ext4 then take back what they had reserved of the range), not later as SIGBUS in
    whichever process touches an unbacked page."""
    if nbytes <= 0:
        return
    try:
        os.posix_fallocate(fd, offset, nbytes)
    except OSError as exc:
        raise SegmentError(exc.errno, f"cannot reserve {nbytes} bytes at {offset} of {what}: "
                                      f"{os.strerror(exc.errno)} ({hint})") from exc


def _close_mapping(mapping) -> None:
    """An mmap.mmap is closed now unless views of it are alive; a ``rawmap.map_fd`` array is unmapped when its
    last view goes (dropping the reference is all there is to do)."""
    if isinstance(mapping, mmap.mmap):
        try:
            mapping.close()
        except BufferError:
            pass  # views of the payload are alive elsewhere; the mapping goes with the last of them


def reserve_and_map(fd: int, total: int, what: str, hint: str, reserved: int | None = None) -> np.ndarray:
    """Size fd to ``total`` bytes, reserve its first ``reserved`` bytes (all when None; the rest stays sparse)
    and map it whole (``rawmap.map_fd``: the mapping keeps no fd)."""
    try:
        os.ftruncate(fd, total)
    except OSError as exc:
        raise SegmentError(exc.errno, f"cannot size {what} to {total} bytes: {os.strerror(exc.errno)}") from exc
    reserve_range(fd, 0, total if reserved is None else min(reserved, total), what, hint)
    return map_fd(fd, total)


def reserved_bytes(reserve: int | None, total: int) -> int:
    """File bytes a segment of ``total`` file bytes reserves at creation for ``reserve`` payload bytes (None:
    all): the header page and the payload rounded up to pages."""
    return total if reserve is None else min(total, PAYLOAD_OFFSET + align_up(reserve, mmap.PAGESIZE))


def shm_keep_free(total: int) -> int:
    """Bytes of a /dev/shm of ``total`` bytes that log segments must leave free (see SHM_KEEP_FREE_MIN)."""
    return max(SHM_KEEP_FREE_MIN, int(total * SHM_KEEP_FREE_FRACTION))


def check_shm_room(nbytes: int, what: str) -> None:
    """SegmentError(ENOSPC) unless reserving ``nbytes`` more in /dev/shm leaves its safety reserve free."""
    st = os.statvfs(SHM_DIR)
    free = st.f_bavail * st.f_frsize
    keep = shm_keep_free(st.f_blocks * st.f_frsize)
    if free - nbytes < keep:
        left = f"only {free} bytes are free" if free < nbytes else f"that would leave {_mib(free - nbytes)} free"
        raise SegmentError(errno.ENOSPC, f"{what}: {nbytes} more bytes in {SHM_DIR}, but {left}, and "
                                         f"{_mib(keep)} are kept for control blocks")


def open_segment_fd(name: str) -> int:
    """A new read-write fd of an existing segment (the caller closes it)."""
    try:
        shm = posix_ipc.SharedMemory(name)
    except posix_ipc.ExistentialError as exc:
        raise SegmentError(errno.ENOENT, f"no shared-memory segment {name}") from exc
    return shm.fd


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
        _close_mapping(mapping)
        raise


class SegmentProvider:
    """Numbered segments of one message log in one tier (``nsqpy.ipc.msglog`` maps them into its window): the duck type
    the log uses (``tier_name``, ``payload_offset``, ``name``, ``create``, ``open``, ``reserve``, ``unlink``).
    Subclasses give ``segment_class`` (Segment or nsqpy.ipc.filesegment.FileSegment), ``name(k)``, ``_fd(k)`` (a new
    fd of an existing segment, SegmentError if there is none) and ``unlink(k)``; ``_check_room`` is the tier's own
    limit on reserving more (the /dev/shm safety reserve for the memory tier)."""

    tier_name = ""
    payload_offset = PAYLOAD_OFFSET
    segment_class = None
    hint = ""

    def _check_room(self, nbytes: int, k: int) -> None:
        pass

    def create(self, k: int, size: int, tag: int, tag_version: int, reserve: int | None = None) -> int:
        """A new zero-filled sparse segment k with its first ``reserve`` payload bytes reserved (None: all);
        returns an fd (the caller closes it) whose payload starts at ``payload_offset``."""
        self._check_room(reserved_bytes(reserve, PAYLOAD_OFFSET + align_up(size, mmap.PAGESIZE)), k)
        self.segment_class.create(self.name(k), size, tag, tag_version, reserve=reserve).close()
        return self._fd(k)

    def open(self, k: int, size: int, tag: int, tag_version: int) -> int:
        self.segment_class.attach(self.name(k), size, tag, tag_version).close()
        return self._fd(k)

    def reserve(self, k: int, start: int, end: int) -> None:
        """Reserve payload bytes [start, end) of segment k (reopened by name: a log keeps no fd open)."""
        self._check_room(end - start, k)
        fd = self._fd(k)
        try:
            reserve_range(fd, self.payload_offset + start, end - start, self.name(k), self.hint)
        finally:
            os.close(fd)


class SegmentReserver:
    """``reserver(offset, nbytes)``: reserve payload bytes [offset, offset + nbytes) of the named segment (see
    the module docstring); SegmentError when /dev/shm cannot hold them. Keeps no fd."""

    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name

    def __call__(self, offset: int, nbytes: int) -> None:
        if offset < 0:
            raise ValueError(f"reservation at {offset} of {self.name}")
        fd = open_segment_fd(self.name)
        try:
            reserve_range(fd, PAYLOAD_OFFSET + offset, nbytes, self.name, "is /dev/shm full?")
        finally:
            os.close(fd)


class Segment(MappedPayload):
    """One mapped segment. ``buf`` is a writable uint8 numpy array of the payload (offset 0 = first payload
    byte); ``size`` its length in bytes."""

    def __init__(self, name: str, mapping: mmap.mmap, owner: bool):
        super().__init__(name, mapping)
        self.owner = owner

    # life-cycle ---------------------------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, size: int, tag: int = 0, tag_version: int = 0,
               reserve: int | None = None) -> "Segment":
        """Create, reserve and stamp a new segment of ``size`` payload bytes; fails if the name exists. With
        ``reserve`` the segment is sparse: only its first ``reserve`` payload bytes (rounded up to pages) are
        reserved now, the owner reserves the rest with ``reserve_range`` before touching it."""
        if size <= 0:
            raise ValueError("segment size must be positive")
        total = PAYLOAD_OFFSET + align_up(size, mmap.PAGESIZE)
        try:
            shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600)
        except posix_ipc.ExistentialError as exc:
            raise SegmentError(errno.EEXIST, f"shared-memory segment {name} already exists "
                                             f"(stale? see nsqpy.ipc.shm.find_stale)") from exc
        try:
            mapping = reserve_and_map(shm.fd, total, f"{name} in {SHM_DIR}", "is /dev/shm full?",
                                      reserved_bytes(reserve, total))
        except BaseException:
            shm.unlink()
            raise
        finally:
            shm.close_fd()
        hdr = words(mapping, 0, HEADER_WORDS)
        pid, start = own_start()
        stamp_header(hdr, SEGMENT_MAGIC, SEGMENT_VERSION, size, (tag, tag_version, pid, start, 0))
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
            mapping = map_fd(shm.fd, shm.size)  # keeps no fd: a process may hold many thousand segments
        finally:
            shm.close_fd()
        check_mapped_header(mapping, SEGMENT_MAGIC, SEGMENT_VERSION, size, (tag, tag_version),
                            f"segment {name}", names=("tag", "tag version"))
        return cls(name, mapping, owner=False)

    def unlink(self) -> None:
        """Remove the name (the creating process does this); existing mappings stay valid."""
        unlink_name(self.name)

    def reserver(self) -> SegmentReserver:
        """What a layout in this segment calls to reserve the pages it is about to touch (``.buf`` offsets)."""
        return SegmentReserver(self.name)

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
        pid, start = own_start()
        self._header[_W["start"]] = start
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


def _path(name: str) -> str:
    return os.path.join(SHM_DIR, name.lstrip("/"))


def _creator(name: str) -> tuple[int, int] | None:
    """(pid, start time) stamped in a segment's header, or None while it has no complete header (read with
    pread, not mapped: a scan of thousands of segments maps nothing). PermissionError: another user's."""
    try:
        fd = os.open(_path(name), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        raw = os.pread(fd, HEADER_WORDS * 8, 0)
    finally:
        os.close(fd)
    if len(raw) < HEADER_WORDS * 8:
        return None
    hdr = np.frombuffer(raw, dtype=np.int64).copy()
    try:
        check_header(hdr, SEGMENT_MAGIC, SEGMENT_VERSION)
    except LayoutError:
        return None
    return int(hdr[_W["pid"]]), int(hdr[_W["start"]])


def _age(name: str, now: float) -> float:
    """Seconds since the segment was created or last resized (infinite if it is gone)."""
    try:
        return now - os.stat(_path(name)).st_mtime
    except FileNotFoundError:
        return float("inf")


class Scan:
    """What one scan of /dev/shm read, so that it reads each segment's header and each creator's /proc entry once
    (a crashed broker with 20,000 topics leaves 40,000 segments, which every other broker's start scans): pass one
    to ``find_dead_instances`` and ``live_creators`` within one decision. Not to be kept: a process it saw alive
    may die."""

    def __init__(self):
        self._creators: dict[str, tuple[int, int] | None] = {}
        self._starts: dict[int, int] = {}

    def creator(self, name: str) -> tuple[int, int] | None:
        if name not in self._creators:
            self._creators[name] = _creator(name)
        return self._creators[name]

    def alive(self, pid: int, start: int) -> bool:
        if pid not in self._starts:
            self._starts[pid] = _start_time(pid) if pid > 0 else -2
        return pid > 0 and self._starts[pid] == start


def live_creators(names, scan: Scan | None = None) -> list[int]:
    """Pids of the processes that created these segments and are still alive (a crashed broker's children may
    outlive their supervisor by a few milliseconds as they die; a running broker's never go)."""
    scan = scan or Scan()
    pids = []
    for name in names:
        creator = scan.creator(name)
        if creator is not None and scan.alive(*creator):
            pids.append(creator[0])
    return pids


def _instance_dead(instance: str, names: list[str], now: float, grace: float, scan: Scan) -> bool:
    control = instance + CONTROL_KIND
    if control in names:
        creator = scan.creator(control)
        if creator is not None:
            return not scan.alive(*creator)
        return _age(control, now) >= grace  # not stamped yet: its supervisor may be creating it right now
    return min(_age(name, now) for name in names) >= grace  # e.g. a broker in its warm-up, before control-0


def _spared(name: str, now: float, grace: float, scan: Scan) -> bool:
    """A segment of a dead instance that must stay all the same: its own creator is alive (an orphaned worker
    still using it, a new broker of the same name warming up), or it is being created right now."""
    creator = scan.creator(name)
    if creator is None:
        return _age(name, now) < grace
    return scan.alive(*creator)


def find_dead_instances(prefix: str = PREFIX, grace: float = INSTANCE_GRACE,
                        scan: Scan | None = None) -> dict[str, list[str]]:
    """{instance prefix (as ``instance_prefix`` gives it): its segment names} for every broker instance on this
    host whose supervisor is gone, whatever its data path and node id (see the theory of operation). Segments
    that must stay (``_spared``) are left out; a live instance never appears."""
    pattern = re.compile(rf"^(/{re.escape(prefix)}-[0-9a-f]{{10}}-)")
    groups: dict[str, list[str]] = {}
    for name in list_segments(f"/{prefix}-"):
        m = pattern.match(name)
        if m:
            groups.setdefault(m.group(1), []).append(name)
    now = time.time()
    scan = scan or Scan()
    dead = {}
    for instance, names in sorted(groups.items()):
        try:
            if not _instance_dead(instance, names, now, grace, scan):
                continue
            gone = [name for name in names if not _spared(name, now, grace, scan)]
        except PermissionError:
            continue  # another user's broker: not ours to judge, nor to remove
        if gone:
            dead[instance] = gone
    return dead


def remove_segments(names) -> tuple[int, int]:
    """Unlink the named segments; returns (how many were removed, the /dev/shm bytes they held: allocated
    blocks, returned once no process maps them any more)."""
    count = nbytes = 0
    for name in names:
        try:
            held = os.stat(_path(name)).st_blocks * 512
            if unlink_name(name):
                count += 1
                nbytes += held
        except (OSError, posix_ipc.Error):
            continue  # gone meanwhile, or not ours to remove: what is left is for its owner
    return count, nbytes
