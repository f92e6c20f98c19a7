"""A worker's directory of the topics and channels it owns, in shared memory, so its replacement finds them.

The directory is a small JSON document (topic names with their log index, their channels with log channel slot
and in-flight channel key, paused flags). It changes only when a topic or channel is created, deleted, paused or
unpaused, so it is simply rewritten whole. Two halves alternate: the writer fills the half not in use, then
publishes ``(sequence << 1) | half`` with a store-release; a reader (the restarted worker, stats) reads the word,
the half, and the word again (a seqlock), so a crash mid-write leaves the previous document intact.

    line 0   header (magic 'NSQMETA1', version, size)
    line 1   current: sequence << 1 | half
    then     half 0: [length][json bytes ...]   half 1: [length][json bytes ...]
"""
import json

from ipc.atomics import py_load_acquire, py_store_release
from ipc.layout import LINE, LINE_WORDS, HEADER_WORDS, check_header, magic, stamp_header, words

MAGIC = magic("NSQMETA1")
VERSION = 1
NBYTES = 1 << 20
HALF = (NBYTES - 2 * LINE) // 2
CURRENT = LINE_WORDS


class Directory:
    def __init__(self, seg):
        self.seg = seg
        self.w = words(seg.buf, 0, NBYTES // 8, "meta directory")
        check_header(self.w[:HEADER_WORDS], MAGIC, VERSION, NBYTES, (), what="meta directory")

    @classmethod
    def create(cls, seg):
        w = words(seg.buf, 0, NBYTES // 8, "meta directory")
        w[:2 * LINE_WORDS] = 0
        w[2 * LINE_WORDS] = 0
        stamp_header(w[:HEADER_WORDS], MAGIC, VERSION, NBYTES, ())
        return cls(seg)

    def _half(self, h):
        start = 2 * LINE + h * HALF
        return start

    def write(self, doc):
        data = json.dumps(doc, separators=(",", ":")).encode()
        if len(data) + 8 > HALF:
            raise ValueError(f"topic directory of {len(data)} bytes does not fit in {HALF}")
        cur = int(py_load_acquire(self.w, CURRENT))
        half = (cur & 1) ^ 1
        start = self._half(half)
        buf = self.seg.buf
        buf[start + 8:start + 8 + len(data)] = memoryview(data)
        self.w[start // 8] = len(data)
        py_store_release(self.w, CURRENT, ((cur >> 1) + 1) << 1 | half)

    def read(self):
        while True:
            cur = int(py_load_acquire(self.w, CURRENT))
            if cur == 0:
                return None
            start = self._half(cur & 1)
            n = int(self.w[start // 8])
            data = bytes(self.seg.buf[start + 8:start + 8 + n])
            if int(py_load_acquire(self.w, CURRENT)) == cur:
                return json.loads(data) if n else None
