"""Bounded channels (issue 49): what a channel's ``max_depth`` / ``max_bytes`` and ``overflow`` do to the
publishes of its topic, inside the topic's owner. ``Topic.append`` calls these only while some channel of the
topic has a bound (``Topic.bounded``); with none, a publish costs one tuple test.

Theory of operation
-------------------
* **What is counted.** A channel's depth is NSQ's (``Channel.depth``: the log ahead of its cursor, requeued, due
  deferred). Its bytes are the log's bytes between its cursor and the head (``channel_bytes``): records with their
  48-byte headers, rounded to 8, in memory and on disk alike; an estimate, since it also counts other channels'
  private copies and a segment's tail padding in that span, and not the requeued or due messages (they count in the
  depth only). A publish of n messages needs n in depth and ``stored_bytes`` of its bodies in bytes.
* **reject**: a publish (not yet acknowledged) that would take a channel over its limit is refused whole
  (``ChannelFull``: ``PUB failed channel T:C is full (max_depth N)``). **block**: such a publish raises
  ``ChannelBlocked``; the caller parks it and holds its producer until the channel has room (a channel with
  nothing waiting takes any publish, so a publish bigger than the limit waits for an empty channel instead of
  forever). **drop_oldest**: every publish is appended, then the channel's oldest waiting messages are dropped until
  it fits (``drop_oldest``), in the order the channel would deliver them: log records ahead of its cursor (the
  cursor passes them; the log reclaims them as consumed ones, so dropped messages never pin it), and requeued and
  due messages once the cursor reached the point they wait behind (``Channel.put_back``: their in-flight slots and
  deferred-store entries are freed), so the bound holds whatever came back. Requeued and due messages count in the
  depth only, so a channel over max_bytes drops log records. Each drop counts in ``Channel.dropped_count``.
  ``#ephemeral`` channels (and every channel of an ``#ephemeral`` topic) always drop_oldest: NSQ drops for them
  rather than block or fail.
* **The mark.** Publishes other workers (or the HTTP API) already answered OK are always appended
  (``acknowledged``): the broker never loses an acknowledged message. So that few arrive over the limit, the owner
  marks the topic in the control block (``workers/control/block.py``, the topic-full mark with a kind) once a
  reject or block channel is at its limit (``limit_state``): senders then refuse (MARK_CHANNEL_FULL) or park
  (MARK_BLOCKED) before answering OK. The bound is soft by what was already in the rings when the mark was set.
  The owner's Forwarder watches every marked topic of its own and clears the mark once the channel is below the
  limit again (consumption, an empty, a deleted channel or a changed policy).
"""
import numpy as np

from nsqpy.ipc.msglog_layout import HDR
from nsqpy.workers.control.block import LIMITS, MARK_BLOCKED, MARK_CHANNEL_FULL

READ_CHUNK = 4096           # log records looked at per read while dropping
_ANY_BYTES = 1 << 62
DEPTH, BYTES = LIMITS.index("max_depth"), LIMITS.index("max_bytes")


def overflow_of(ch):
    """What a publish over ch's bound does: its policy's overflow, but always drop_oldest for #ephemeral."""
    if ch.ephemeral or ch.topic.ephemeral:
        return "drop_oldest"
    return ch.policy.overflow


def stored_bytes(lengths):
    """Log bytes of messages with these body lengths (int64 array): headers included, rounded up to 8."""
    if len(lengths) == 1:
        return (HDR + int(lengths[0]) + 7) & ~7
    return int(((lengths + (HDR + 7)) & ~7).sum())


def channel_bytes(ch):
    log = ch.topic.log
    return log.head - log.cursor(ch.ch)


def _over(ch, n, need):
    """(limit index, its value) that n more messages of ``need`` bytes would take ch past, or None."""
    p = ch.policy
    if p.max_depth and ch.depth() + n > p.max_depth:
        return DEPTH, p.max_depth
    if p.max_bytes and channel_bytes(ch) + need > p.max_bytes:
        return BYTES, p.max_bytes
    return None


def _describe(topic, ch, over):
    return f"channel {topic.name}:{ch.name} is full ({LIMITS[over[0]]} {over[1]})"


def admit(topic, n, lengths):
    """None when a publish of n messages (body lengths ``lengths``) fits every reject and block channel of topic;
    else ("reject", reason) for the first reject channel it would take over its limit, or ("block", reason) for
    the first block channel it would that has messages waiting."""
    need = stored_bytes(lengths) if any(ch.policy.max_bytes for ch in topic.bounded) else 0
    blocked = None
    for ch in topic.bounded:
        mode = overflow_of(ch)
        if mode == "drop_oldest":
            continue
        over = _over(ch, n, need)
        if over is None:
            continue
        if mode == "reject":
            return "reject", _describe(topic, ch, over)
        if blocked is None and ch.depth() > 0:
            blocked = _describe(topic, ch, over)
    return ("block", blocked) if blocked is not None else None


def limit_state(topic):
    """The channel mark topic should carry now: (MARK_*, channel name, limit index, value) for the first reject
    channel at its limit (else the first block channel at its limit), or None. At its limit: one more message
    would not fit (depth >= max_depth, bytes >= max_bytes)."""
    blocked = None
    for ch in topic.bounded:
        mode = overflow_of(ch)
        if mode == "drop_oldest":
            continue
        over = _over(ch, 1, 1)
        if over is None:
            continue
        if mode == "reject":
            return MARK_CHANNEL_FULL, ch.name, over[0], over[1]
        if blocked is None:
            blocked = MARK_BLOCKED, ch.name, over[0], over[1]
    return blocked


def trim(topic):
    """After an append: every drop_oldest channel of topic dropped down to its limits; -> messages dropped."""
    dropped = 0
    for ch in topic.bounded:
        if overflow_of(ch) == "drop_oldest":
            dropped += drop_oldest(ch)
    return dropped


def drop_oldest(ch):
    """Drop ch's oldest waiting messages, in the order they would be delivered, until it is within its max_depth
    and max_bytes; -> how many, also added to ch.dropped_count. (Requeued and due messages count in the depth,
    not in the bytes: a channel over max_bytes only drops log records.)"""
    p, log = ch.policy, ch.topic.log
    dropped = 0
    while True:
        over_n = ch.depth() - p.max_depth if p.max_depth else 0
        over_b = channel_bytes(ch) - p.max_bytes if p.max_bytes else 0
        if over_n <= 0 and over_b <= 0:
            break
        mark = _earliest_mark(ch)
        k = 0
        if mark is None or log.cursor(ch.ch) < mark or over_n <= 0:
            k = _drop_log(ch, over_n, over_b, mark if over_n > 0 else None)
        if k == 0 and over_n > 0 and mark is not None:
            k = _drop_came_back(ch, over_n)
        if k == 0:
            break
        dropped += k
    if dropped:
        ch.dropped_count += dropped
        w = ch.worker
        w.touched.add(ch.topic)       # the reclaim pass frees what no channel needs any more
        w.stats.changed.add(ch.topic.name)
    return dropped


def _earliest_mark(ch):
    """The log position the first requeued or due message waits behind (Channel.put_back), or None."""
    marks = [q[0][1] for q in (ch.requeued, ch.due) if q]
    return min(marks) if marks else None


def _drop_log(ch, over_n, over_b, before):
    """Move ch's cursor past its oldest log records: over_n of them, or as many as leave at most max_bytes, but
    only records before position ``before`` (None: any); -> how many it passed."""
    log = ch.topic.log
    if log.depth(ch.ch) == 0:
        return 0
    b = log.read(ch.ch, min(max(over_n, 1), READ_CHUNK) if over_b <= 0 else READ_CHUNK, _ANY_BYTES)
    n = b.n if before is None else int(np.searchsorted(b.positions[:b.n], before))
    if n == 0:
        return 0
    k = min(max(over_n, 0), n)
    if over_b > 0:  # the first record whose end leaves at most max_bytes after it
        ends = np.append(b.positions[1:b.n], b.next_position)[:n]
        k = max(k, min(int(np.searchsorted(ends - log.cursor(ch.ch), over_b)) + 1, n))
    log.advance(ch.ch, int(b.positions[k]) if k < b.n else b.next_position)
    return k


def _drop_came_back(ch, k):
    """Drop up to k of ch's requeued and due messages that come next (those whose mark the cursor reached), the
    earliest mark first; -> how many (their in-flight slots and deferred-store entries are freed)."""
    w = ch.worker
    cursor = ch.topic.log.cursor(ch.ch)
    slots, entries = [], []
    while len(slots) + len(entries) < k:
        r = ch.requeued[0][1] if ch.requeued else None
        d = ch.due[0][1] if ch.due else None
        if r is not None and (d is None or r <= d):
            if r > cursor and ch.topic.log.depth(ch.ch):
                break
            slots.append(ch.requeued.popleft()[0])
        elif d is not None:
            if d > cursor and ch.topic.log.depth(ch.ch):
                break
            entries.append(ch.due.popleft()[0])
        else:
            break
    for slot in slots:
        w.inflight.release(slot)
    if entries:
        w.deferred.free(np.array(entries, np.int64))
    return len(slots) + len(entries)
