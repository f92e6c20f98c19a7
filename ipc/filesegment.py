"""File-backed segments: the disk tier of the message log (spill), with the same duck type as ``nsqpy.ipc.shm.Segment``.

Theory of operation
-------------------
A file segment is a regular file ``[header page][payload]`` mapped shared, so every process that maps it sees
the same bytes through the page cache, exactly as with a /dev/shm segment; only the backing store differs. The
header is the common layout header (``nsqpy.ipc.layout``: magic 'NSQPYFSG', layout version, payload size, tag, tag
version), written with the magic last, so a file cut short by a crash during creation is refused on attach
rather than read as a segment. Creation is O_CREAT|O_EXCL plus ``posix_fallocate``: a full disk fails at creation
with ``SegmentError``, never later as SIGBUS in whichever process touches an unbacked page (a write fault on a hole
of an ext4 file that finds no free block). Like a /dev/shm log segment, a file segment of the log is sparse
(``reserve=``): sized in full, reserved as the log reaches it (``FileSegmentProvider.reserve``), so a spilled
topic takes disk blocks for what it holds, not for its segment size.

Durability: pages reach the disk when the kernel writes them back (or on ``flush()``); a segment survives the
death of every process, not a power cut, unless flushed. Nothing here registers with a resource tracker.

``FileSegmentProvider`` hands numbered segments of one log to ``nsqpy.ipc.msglog.MessageLog`` as file descriptors whose
payload starts at ``payload_offset`` (the log maps them into its own window); see ``nsqpy.ipc.shm.SegmentProvider``.
"""
from __future__ import annotations

import errno
import mmap
import os


from nsqpy.ipc.layout import HEADER_WORDS, LayoutError, align_up, magic, stamp_header, words
from nsqpy.ipc.rawmap import madvise, map_fd
from nsqpy.ipc.shm import (MappedPayload, SegmentError, SegmentProvider, check_mapped_header, reserve_and_map,
                     reserved_bytes)

__all__ = ["FileSegment", "FileSegmentProvider", "PAYLOAD_OFFSET"]

FILE_MAGIC = magic("NSQPYFSG")
FILE_VERSION = 1
PAYLOAD_OFFSET = mmap.PAGESIZE


class FileSegment(MappedPayload):
    """One mapped file segment; ``buf`` is a writable uint8 numpy array of the payload, ``size`` its length."""

    def __init__(self, path: str, mapping: mmap.mmap):
        super().__init__(path, mapping)
        self.path = path

    @classmethod
    def create(cls, path: str, size: int, tag: int = 0, tag_version: int = 0,
               reserve: int | None = None) -> "FileSegment":
        """Create, reserve and stamp a new file of ``size`` payload bytes; fails if the path exists. With
        ``reserve`` only the header and the first ``reserve`` payload bytes are reserved (as ``Segment.create``)."""
        if size <= 0:
            raise ValueError("segment size must be positive")
        total = PAYLOAD_OFFSET + align_up(size, mmap.PAGESIZE)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError as exc:
            raise SegmentError(errno.EEXIST, f"file segment {path} already exists") from exc
        try:
            mapping = reserve_and_map(fd, total, path, "is the disk full?", reserved_bytes(reserve, total))
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        madvise(mapping.ctypes.data, total, mmap.MADV_RANDOM)  # its header's write reads nothing ahead (a fresh
        # file's first write fault would zero-fill up to read_ahead_kb of it: ipc/msglog_window.py)
        stamp_header(words(mapping, 0, HEADER_WORDS), FILE_MAGIC, FILE_VERSION, size, (tag, tag_version))
        return cls(path, mapping)

    @classmethod
    def attach(cls, path: str, size: int | None = None, tag: int | None = None,
               tag_version: int | None = None) -> "FileSegment":
        """Map an existing file segment, checking magic, layout version and (when given) size and tag."""
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise SegmentError(errno.ENOENT, f"no file segment {path}") from exc
        try:
            length = os.fstat(fd).st_size
            if length < PAYLOAD_OFFSET:
                raise LayoutError(f"file segment {path}: {length} bytes is too small to hold a header")
            mapping = map_fd(fd, length)
        finally:
            os.close(fd)
        check_mapped_header(mapping, FILE_MAGIC, FILE_VERSION, size, (tag, tag_version), f"file segment {path}")
        return cls(path, mapping)

    @property
    def tag(self) -> tuple[int, int]:
        return int(self._header[3]), int(self._header[4])

    def flush(self) -> None:
        """Write dirty pages to the disk: the mapping shares the file's page cache, so an fsync of the file
        writes them (the mapping keeps no fd of its own)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def unlink(self) -> None:
        self.unlink_path(self.path)

    @staticmethod
    def unlink_path(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

class FileSegmentProvider(SegmentProvider):
    """Segments ``<directory>/<prefix>.<k>.seg`` of one message log (the disk tier)."""

    tier_name = "disk"
    segment_class = FileSegment
    hint = "is the disk full?"

    def __init__(self, directory: str, prefix: str):
        if "/" in prefix or not prefix:
            raise ValueError(f"bad segment file prefix {prefix!r}")
        self.directory = directory
        self.prefix = prefix

    def name(self, k: int) -> str:
        return os.path.join(self.directory, f"{self.prefix}.{k:012d}.seg")

    def _fd(self, k: int) -> int:
        try:
            return os.open(self.name(k), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise SegmentError(errno.ENOENT, f"no file segment {self.name(k)}") from exc

    def unlink(self, k: int) -> None:
        try:
            os.unlink(self.name(k))
        except FileNotFoundError:
            pass

    def sync(self, k: int) -> None:
        """fdatasync segment k: the pages the log wrote through its mapping reach the disk (they are the file's
        page cache). A segment already gone (reclaimed) needs nothing."""
        try:
            fd = self._fd(k)
        except SegmentError:
            return
        try:
            os.fdatasync(fd)
        finally:
            os.close(fd)
