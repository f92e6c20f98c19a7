"""Dead letters (issue 49), the broker's side: packing the dead letters of held messages into one publish, the
marks that keep a move from being lost or sent to the channel's consumers again in a worker crash, and the waiter
of a parked dead-letter publish. The format itself (encode/decode) is ``nsqpy/protocol/dead_letter.py``.

The move. The message to move holds an in-flight slot in the REQUEUED state that no queue of its channel holds
(so nothing delivers it, and a SIGKILL's recovery finds it); its slot's spare word gets a mark (``mark``: the
slot's generation and the reason), then the dead letter is published through the worker's one publish decision
(``Forwarder.commit``: appended here or one FORWARD record to the owner's ring), then the slot is released. A
recovering worker honours a valid mark (``marked``): such a slot is dead-lettered again rather than requeued, so
a message decided dead is never delivered to its channel's consumers again (a crash after the commit and before
the release sends it twice to the dead-letter topic; its header's id tells the copies apart). The mark is valid
only with the generation the slot had when it was marked: every later change of the slot (release, reuse) bumps
the generation, so a stale mark on a reused slot means nothing and no write is needed to clear it.
"""
from __future__ import annotations

import numpy as np

from nsqpy.ipc import inflight as IF
from nsqpy.protocol.dead_letter import MAX_ATTEMPTS, TTL, decode, encode, encode_header  # noqa: F401 (re-exported)
from nsqpy.workers.lane.kernels import generations

_CODE = {MAX_ATTEMPTS: 1, TTL: 2}
_REASON = {1: MAX_ATTEMPTS, 2: TTL}
S_MARK = IF.S_HASH + 1   # the in-flight slot's spare word (ipc/inflight.py's layout: "HASH, 1 spare")


# ---- the publish ----------------------------------------------------------------------------------------------
def pack(topic, channel, log, table, slots, reason):
    """The dead letters of the messages held in ``slots`` (one channel's) as one publish -> (src, offsets,
    lengths) for ``Forwarder.commit``. The header is ``encode_header``'s, built from a per-publish prefix."""
    which = np.asarray(slots, np.int64)
    _, pos, att = generations(table, which)
    ids = table.slots[which * IF.SLOT_WORDS + IF.S_MSG_ID].view(np.uint64).tolist()
    stamps = log.records_at(pos).timestamps[:len(which)].tolist()
    head = encode_header(topic, channel, 0, 0, 0, reason)
    prefix = head[:head.index(b'"id":"') + 6].decode()
    parts = [f'{prefix}{msg_id:016x}","attempts":{a},"timestamp":{ts},"reason":"{reason}"}}\n'.encode() + log.body(p)
             for msg_id, a, ts, p in zip(ids, att.tolist(), stamps, pos.tolist())]
    lengths = np.fromiter((len(p) for p in parts), np.int64, len(parts))
    offsets = np.zeros(len(parts), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    return np.frombuffer(b"".join(parts), np.uint8), offsets, lengths


def attempts_of(table, slot):
    """A live slot's attempts (its current half's ATTEMPTS word), without building a ``SlotInfo``."""
    b = slot * IF.SLOT_WORDS
    tag = int(table.slots[b + IF.S_TAG])
    return int(table.slots[b + IF.S_HALF0 + ((tag >> 2) & 1) * IF.HALF_WORDS + IF.F_ATTEMPTS])


# ---- the marks -----------------------------------------------------------------------------------------------
def mark(table, slot, reason):
    """Mark a held slot as being dead-lettered (one store of its spare word) -> the mark (``still_marked``)."""
    value = (int(table.slots[slot * IF.SLOT_WORDS + IF.S_TAG]) >> 3) << 2 | _CODE[reason]
    table.slots[slot * IF.SLOT_WORDS + S_MARK] = value
    return value


def unmark(table, slot):
    table.slots[slot * IF.SLOT_WORDS + S_MARK] = 0


def _live_mark(table, slot):
    """(mark word, generation) of a live slot; (0, -1) for a free or unreserved one."""
    if slot >= table.reserved:
        return 0, -1
    b = slot * IF.SLOT_WORDS
    tag = int(table.slots[b + IF.S_TAG])
    if tag & 3 == IF.FREE:
        return 0, -1
    return int(table.slots[b + S_MARK]), tag >> 3


def still_marked(table, slot, value):
    """The slot still holds the message marked with ``value`` (not released, reused or emptied since)."""
    word, gen = _live_mark(table, slot)
    return word == value and gen == value >> 2


def marked(table, slot):
    """The reason a live slot was marked with and the mark still holds (a recovering worker dead-letters it
    again), else None."""
    word, gen = _live_mark(table, slot)
    return _REASON.get(word & 3) if word and word >> 2 == gen else None


# ---- a parked dead-letter publish ----------------------------------------------------------------------------
class Waiter:
    """Stands for a session on a ``Parked`` publish (``forwarding.Parked.add``): the ring to the dead-letter topic's
    owner had no room, so the dead letters wait there; ``count_pub`` means they were committed (``done()``: the
    slots are released), ``fail_held`` that they were refused (``failed(err)``: the messages go back)."""
    __slots__ = ("done", "failed", "closed")
    remote_text = "dead letters"

    def __init__(self, done, failed):
        self.done = done
        self.failed = failed
        self.closed = False

    def hold(self):
        pass

    def release(self):
        pass

    def count_pub(self, topic, n):
        self.done()

    def fail_held(self, err):
        self.failed(err)

    def close(self):
        self.closed = True
