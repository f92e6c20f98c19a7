"""Dead letters (issue 49): the message a channel moves to its dead-letter topic, and the marks that keep the move
from being lost or doubled in a worker crash.

The format. A dead letter is an ordinary new message of the dead-letter topic (an ID of that topic's own, so IDs
stay unique there even when several topics share one dead-letter topic) whose body is one JSON header line, then
``\\n``, then the original body, byte for byte::

    {"topic":"T","channel":"C","id":"<16 hex digits>","attempts":N,"timestamp":<publish ns>,"reason":"ttl"}\\n<body>

``reason`` is ``max_attempts`` (the message was delivered ``attempts`` times, then REQ'd, timed out or its
consumer went away with it in flight) or ``ttl`` (it was older than the channel's ``message_ttl_ms`` when it came
up for delivery; ``attempts`` is how often it was delivered before). ``decode`` reads one back (a consumer of the
dead-letter topic: ``nsqpy.client`` re-exports it as ``decode_dead_letter``).

The move. The message to move holds an in-flight slot in the REQUEUED state that no queue of its channel holds
(so nothing delivers it, and a SIGKILL's recovery finds it); its slot's spare word gets a mark (``mark``: the
slot's generation and the reason), then the dead letter is published through the worker's one publish decision
(``Forwarder.commit``: appended here or one FORWARD record to the owner's ring), then the slot is released. A
recovering worker honours a valid mark (``marked``): such a slot is dead-lettered again rather than requeued, so
a message decided dead is never delivered to its channel's consumers again. The mark is valid only with the
generation the slot had when it was marked: every later change of the slot (release, reuse) bumps the generation,
so a stale mark on a reused slot means nothing and no write is needed to clear it.
"""
from __future__ import annotations

import json

import numpy as np

from nsqpy.ipc import inflight as IF

MAX_ATTEMPTS = "max_attempts"
TTL = "ttl"
REASONS = (MAX_ATTEMPTS, TTL)
_CODE = {MAX_ATTEMPTS: 1, TTL: 2}
_REASON = {1: MAX_ATTEMPTS, 2: TTL}
S_MARK = IF.S_HASH + 1   # the in-flight slot's spare word (ipc/inflight.py's layout: "HASH, 1 spare")
HEADER_FIELDS = ("topic", "channel", "id", "attempts", "timestamp", "reason")


# ---- the format ----------------------------------------------------------------------------------------------
def encode_header(topic, channel, msg_id, attempts, timestamp, reason):
    """The header line (with its ``\\n``) of a dead letter of message ``msg_id`` (the uint64 ID) of topic/channel."""
    return json.dumps({"topic": topic, "channel": channel, "id": f"{msg_id:016x}", "attempts": int(attempts),
                       "timestamp": int(timestamp), "reason": reason}, separators=(",", ":")).encode() + b"\n"


def encode(topic, channel, msg_id, attempts, timestamp, reason, body):
    return encode_header(topic, channel, msg_id, attempts, timestamp, reason) + bytes(body)


def decode(body):
    """A dead letter's body -> (header dict with HEADER_FIELDS, the original body). ValueError when it is not one."""
    raw = bytes(body)
    line, sep, rest = raw.partition(b"\n")
    if not sep:
        raise ValueError("not a dead letter: no header line")
    try:
        header = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"not a dead letter: its header is not JSON ({e})") from None
    if not isinstance(header, dict) or any(k not in header for k in HEADER_FIELDS):
        raise ValueError(f"not a dead letter: its header lacks one of {', '.join(HEADER_FIELDS)}")
    return header, rest


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
