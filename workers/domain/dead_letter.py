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

_CODE = {MAX_ATTEMPTS: 1, TTL: 2}
_REASON = {1: MAX_ATTEMPTS, 2: TTL}
S_MARK = IF.S_HASH + 1   # the in-flight slot's spare word (ipc/inflight.py's layout: "HASH, 1 spare")


# ---- the publish ----------------------------------------------------------------------------------------------
def pack(topic, channel, log, infos, reason):
    """The dead letters of the held messages ``infos`` (``SlotInfo``s of one channel's slots) as one publish ->
    (src, offsets, lengths) for ``Forwarder.commit``."""
    recs = log.records_at(np.fromiter((i.log_pos for i in infos), np.int64, len(infos)))
    stamps = recs.timestamps[:len(infos)].tolist()
    parts = [encode_header(topic, channel, info.msg_id, info.attempts, ts, reason) + log.body(info.log_pos)
             for info, ts in zip(infos, stamps)]
    lengths = np.fromiter((len(p) for p in parts), np.int64, len(parts))
    offsets = np.zeros(len(parts), np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    return np.frombuffer(b"".join(parts), np.uint8), offsets, lengths


# ---- the marks -----------------------------------------------------------------------------------------------
def mark(table, slot, reason):
    """Mark a held slot as being dead-lettered (one store of its spare word) -> the mark (``still_marked``)."""
    value = table.generation(slot) << 2 | _CODE[reason]
    table.slots[slot * IF.SLOT_WORDS + S_MARK] = value
    return value


def unmark(table, slot):
    table.slots[slot * IF.SLOT_WORDS + S_MARK] = 0


def still_marked(table, slot, value):
    """The slot still holds the message marked with ``value`` (not released, reused or emptied since)."""
    return slot < table.reserved and int(table.slots[slot * IF.SLOT_WORDS + S_MARK]) == value and \
        table.generation(slot) == value >> 2 and table.slot(slot).state != IF.FREE


def marked(table, slot):
    """The reason a live slot was marked with and the mark still holds (a recovering worker dead-letters it
    again), else None."""
    if slot >= table.reserved:
        return None
    value = int(table.slots[slot * IF.SLOT_WORDS + S_MARK])
    reason = _REASON.get(value & 3)
    if reason is None or value >> 2 != table.generation(slot) or table.slot(slot).state == IF.FREE:
        return None
    return reason


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
