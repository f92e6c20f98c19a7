"""What travels in the publish rings towards a topic's owner, and who that owner is: the one codec that every side
imports (a worker forwarding publishes, the owner appending them, a non-worker process using
``workers/control/client.py``).

Record types (the ring header's type word, ``nsqpy.ipc.ring``):

    FORWARD           a forwarded publish, already answered OK by its sender:
                      head (<qqqq: message count n, timestamp ns, defer ms, topic name length), the topic name,
                      n little-endian int64 body lengths, then the n bodies back to back
    FORWARD_BY_FILE   the utf-8 path of a file holding a FORWARD payload too big for the ring (the owner appends
                      from it and removes it; a re-read after a crash that finds no file knows it was appended)
    COMMAND           a control command for the owner (<qqqqqq: reply slot, sequence, op, topic name length,
                      channel name length, flags), the topic name, the channel name; the owner stores
                      (sequence, status) in the reply words of the slot (``workers/control/client.py``)

Back-pressure between a sender and the ring's reader (``want_room`` and friends): a sender whose ring is full
keeps its publish (and the client's connection unread) and sets the ring's WANT_ROOM word; the reader, after every
drain that released records, checks that word and wakes the sender. Both sides store, fence, then load what the
other stored (the sender: WANT_ROOM, then the ring's HEAD; the reader: HEAD, then WANT_ROOM), so either the sender
sees the room or the reader sees the flag: no wake-up is lost (the pattern of ``nsqpy.ipc.wake``).
"""
import struct
import zlib

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, JIT_CALLEE, warm_up_step
from nsqpy.ipc.atomics import copy_bytes, fence, load_acquire, store_release
from nsqpy.ipc.layout import read_only
from nsqpy.ipc.ring import P_WANT_ROOM

FORWARD = 1
FORWARD_BY_FILE = 2
COMMAND = 3

FWD_HEAD = struct.Struct("<qqqq")     # message count, timestamp ns, defer ms, topic name length
CMD_HEAD = struct.Struct("<qqqqqq")   # reply slot, sequence, op, topic name length, channel name length, flags
FWD_HEAD_SIZE = FWD_HEAD.size


def owner_of(topic, workers):
    """The worker that owns a topic: a stable hash of its name, the same in every process."""
    return zlib.crc32(topic.encode()) % workers


# ---- forwarded publishes ---------------------------------------------------------------------------------
@njit(**JIT)
def pack_bodies(src, offsets, lengths, out, at):
    """n little-endian int64 lengths, then the n bodies src[offsets[i]:offsets[i]+lengths[i]], into out[at:]
    (a forwarded publish's payload after its header); returns the end."""
    n = lengths.size
    end = at + 8 * n
    for i in range(n):
        if offsets[i] < 0 or lengths[i] < 0 or offsets[i] + lengths[i] > src.size:
            raise IndexError("pack_bodies: a body outside src")
        end += lengths[i]
    if at < 0 or end > out.size:
        raise IndexError("pack_bodies: out is too small")
    for i in range(n):
        v = lengths[i]
        for k in range(8):
            out[at + 8 * i + k] = (v >> (8 * k)) & 0xFF
    p = at + 8 * n
    for i in range(n):  # copy_bytes, not out[p:p + k] = src[o:o + k]: a slice assignment compiles numba's
        copy_bytes(out, p, src, offsets[i], lengths[i])  # broadcasting and its messages on a cold cache
        p += lengths[i]
    return p


def forward_size(name, lengths):
    """Bytes of the FORWARD payload of these bodies for the topic named ``name`` (bytes)."""
    return FWD_HEAD.size + len(name) + 8 * len(lengths) + int(lengths.sum())


@njit(inline="always", **JIT_CALLEE)
def _put_le64(out, at, v):
    for k in range(8):
        out[at + k] = (v >> (8 * k)) & 0xFF


@njit(**JIT)
def write_forward(out, at, name, name_len, src, offsets, lengths, timestamp_ns, defer_ms):
    """The one encoder of a FORWARD payload (module docstring), into out[at:]: the head, the topic name
    name[:name_len], then ``pack_bodies``; -> its end. The Python path (``pack_forward``) and the forward lane
    (``workers/lane/fastlane.py`` ``forward_staged``, straight into a claimed ring record) both write with it."""
    p = at + FWD_HEAD_SIZE
    if at < 0 or name_len < 0 or name_len > name.size or p + name_len > out.size:
        raise IndexError("write_forward: out is too small")
    _put_le64(out, at, lengths.size)
    _put_le64(out, at + 8, timestamp_ns)
    _put_le64(out, at + 16, defer_ms)
    _put_le64(out, at + 24, name_len)
    for i in range(name_len):  # not a slice assignment: see pack_bodies
        out[p + i] = name[i]
    return pack_bodies(src, offsets, lengths, out, p + name_len)


def pack_forward(out, name, src, offsets, lengths, timestamp_ns, defer_ms):
    """Write the FORWARD payload into out (a uint8 array of at least forward_size bytes); -> the payload view."""
    name_arr = np.frombuffer(name, np.uint8)
    return out[:write_forward(out, 0, name_arr, len(name), read_only(src), offsets, lengths, int(timestamp_ns),
                              int(defer_ms))]


def forward_topic(payload):
    """(message count, timestamp ns, topic) of a FORWARD payload (for logs and set-aside files)."""
    n, ts, _, tl = FWD_HEAD.unpack_from(payload)
    return n, ts, bytes(payload[FWD_HEAD.size:FWD_HEAD.size + tl]).decode(errors="replace")


def unpack_forward(payload, one_off, one_len):
    """-> (topic, offsets, lengths, timestamp ns, defer ms): message i is payload[offsets[i]:+lengths[i]].
    A single message reuses the one-element arrays one_off/one_len (no allocation on the common path)."""
    n, ts, defer_ms, tl = FWD_HEAD.unpack_from(payload)
    p = FWD_HEAD.size
    topic = bytes(payload[p:p + tl]).decode()
    p += tl
    if n == 1:
        lengths, offsets = one_len, one_off
        lengths[0] = payload[p:p + 8].view("<i8")[0]
        offsets[0] = p + 8
    else:
        lengths = np.frombuffer(payload, "<i8", n, p).astype(np.int64)
        p += 8 * n
        offsets = np.empty(n, np.int64)
        offsets[0] = p
        np.cumsum(lengths[:-1], out=offsets[1:])
        offsets[1:] += p
    return topic, offsets, lengths, ts, defer_ms


EMPTY_FORWARD = np.frombuffer(FWD_HEAD.pack(0, 0, 0, 0), np.uint8)  # stands for a forward whose file is gone


# runs of forwarded publishes: what the owner appends with one call -----------------------------------------
RUN_FIRST, RUN_RECORDS, RUN_APPEND, RUN_MSG, RUN_MSGS, RUN_NAME, RUN_NAME_LEN = range(7)
RUN_WORDS = 7


@njit(**JIT_CALLEE)
def _le64(data, at):
    v = np.int64(0)
    for k in range(8):
        v |= np.int64(data[at + k]) << np.int64(8 * k)
    return v


@njit(**JIT_CALLEE)
def _same_bytes(data, a, b, n):
    for k in range(n):
        if data[a + k] != data[b + k]:
            return False
    return True


@njit(**JIT_CALLEE)
def plain_forward(data, o, length):
    """(messages, timestamp ns, name length) of the FORWARD payload data[o:o+length] when it is a plain one: at
    least one message, no defer, a topic name of 1 to 64 bytes, bodies that fill the record exactly; (0, 0, 0)
    for any other (a deferred or malformed publish: the one-record path's)."""
    head = FWD_HEAD_SIZE
    if length < head:
        return 0, 0, 0
    end = o + length
    cnt = _le64(data, o)
    ts = _le64(data, o + 8)
    tl = _le64(data, o + 24)
    if not (cnt > 0 and _le64(data, o + 16) == 0 and 0 < tl <= 64 and o + head + tl + 8 * cnt <= end):
        return 0, 0, 0
    p = o + head + tl
    total = 0
    for k in range(cnt):
        ln = _le64(data, p + 8 * k)
        if ln < 0:
            return 0, 0, 0
        total += ln
    if p + 8 * cnt + total != end:
        return 0, 0, 0
    return cnt, ts, tl


@njit(**JIT)
def plan_forward_runs(data, offs, lens, types, runs, msg_off, msg_len, msg_ts):
    """Group a drained batch of ring records (payload i at data[offs[i]:offs[i]+lens[i]]) into runs, in order.
    A run of RUN_APPEND = 1 is consecutive FORWARD records for one topic without a defer: its RUN_MSGS messages
    (body offsets into data, lengths, each record's timestamp) are msg_*[RUN_MSG:RUN_MSG+RUN_MSGS], its topic name
    data[RUN_NAME:+RUN_NAME_LEN], so the owner appends them with one call. Any other record (a command, a file,
    a deferred or malformed publish) is a run of its own with RUN_APPEND = 0, for the one-record path.
    -> (runs, messages); (-1, messages needed) when msg_* are too small."""
    head = FWD_HEAD_SIZE
    need = 0
    for i in range(offs.size):
        if types[i] == FORWARD and lens[i] >= head:
            need += max(_le64(data, offs[i]), 0)
    if need > msg_off.size:
        return -1, need
    r = 0
    m = 0
    for i in range(offs.size):
        o = offs[i]
        cnt, ts, tl = 0, 0, 0
        if types[i] == FORWARD:
            cnt, ts, tl = plain_forward(data, o, lens[i])
        if cnt == 0:
            runs[r, RUN_FIRST] = i
            runs[r, RUN_RECORDS] = 1
            runs[r, RUN_APPEND] = 0
            runs[r, RUN_MSG] = m
            runs[r, RUN_MSGS] = 0
            runs[r, RUN_NAME] = 0
            runs[r, RUN_NAME_LEN] = 0
            r += 1
            continue
        name = o + head
        if r > 0 and runs[r - 1, RUN_APPEND] == 1 and runs[r - 1, RUN_NAME_LEN] == tl and \
                _same_bytes(data, runs[r - 1, RUN_NAME], name, tl):
            runs[r - 1, RUN_RECORDS] += 1
        else:
            runs[r, RUN_FIRST] = i
            runs[r, RUN_RECORDS] = 1
            runs[r, RUN_APPEND] = 1
            runs[r, RUN_MSG] = m
            runs[r, RUN_MSGS] = 0
            runs[r, RUN_NAME] = name
            runs[r, RUN_NAME_LEN] = tl
            r += 1
        p = name + tl
        body = p + 8 * cnt
        for k in range(cnt):
            ln = _le64(data, p + 8 * k)
            msg_off[m] = body
            msg_len[m] = ln
            msg_ts[m] = ts
            body += ln
            m += 1
        runs[r - 1, RUN_MSGS] += cnt
    return r, m


# ---- control commands ------------------------------------------------------------------------------------
def pack_command(slot, seq, op, topic, channel=None, flags=0):
    t = topic.encode()
    c = (channel or "").encode()
    return CMD_HEAD.pack(slot, seq, op, len(t), len(c), flags) + t + c


def unpack_command(payload):
    """-> (reply slot, sequence, op, topic, channel or None, flags)."""
    slot, seq, op, tl, cl, flags = CMD_HEAD.unpack_from(payload)
    p = CMD_HEAD.size
    topic = bytes(payload[p:p + tl]).decode(errors="replace")
    channel = bytes(payload[p + tl:p + tl + cl]).decode(errors="replace") if cl else None
    return slot, seq, op, topic, channel, flags


# ---- room in a ring (sender waits, reader wakes it) -------------------------------------------------------
@njit(**JIT)
def set_want_room(ctl, value):
    """Producer: announce (1) or withdraw (0) that it waits for room; fenced, so its next HEAD load comes after."""
    store_release(ctl, P_WANT_ROOM, value)
    fence()


@njit(**JIT)
def want_room(ctl):
    """Reader, after releasing records: does the producer wait for room? (fenced after the release)"""
    fence()
    return load_acquire(ctl, P_WANT_ROOM) != 0


@warm_up_step
def warm_up():
    """Compile (or load) the kernels above before fork (workers/lane/warmup.py)."""
    from nsqpy.ipc.ring import Ring
    buf = bytearray(Ring.size_for(1 << 12))
    ring = Ring.create(buf, 0, 1 << 12)
    set_want_room(ring.ctl, 1)
    want_room(ring.ctl)
    set_want_room(ring.ctl, 0)
    out = np.empty(64, np.uint8)
    pack_forward(out, b"t", np.frombuffer(b"xy", np.uint8), np.zeros(1, np.int64), np.ones(1, np.int64), 0, 0)
    ring.write(out[:forward_size(b"t", np.ones(1, np.int64))].tobytes(), FORWARD)
    offs, lens, types = ring.read_batch(4)
    msgs = tuple(np.zeros(4, np.int64) for _ in range(3))
    plan_forward_runs(ring.data, offs, lens, types, np.zeros((4, RUN_WORDS), np.int64), *msgs)
