"""A way into the topic owners for processes that are not workers (the HTTP API's gunicorn workers, an nsqlookupd
registrar): publish to any topic, and send control commands (create, delete, empty, pause, unpause of topics and
channels), through one producer slot of the links (``workers/publishing/links.py``: slots from ``workers`` up).

Theory of operation
-------------------
* ``publish(topic, bodies, defer_ms)`` packs the messages as the FORWARD record a worker forwards
  (``workers/publishing/records.py``; a record bigger than the ring's ``large_forward`` goes by file, FORWARD_BY_FILE) and
  commits it to the ring from this slot to the topic's owner. Committed is acknowledged, as for a worker's
  forward: the owner appends it, and a crash of either side after the commit loses nothing (at worst the owner
  appends it twice). A full ring is back-pressure: the publish sets the ring's WANT_ROOM flag and sleeps on this
  slot's eventfd until the owner has drained some records (it wakes us), then tries again. It fails
  (``PublishFailed``, nsqd's E_PUB_FAILED) only for a real limit: the owner marked the topic full, or it cannot
  store the record at the head of that ring (STALLED: no space); or when the caller's ``timeout`` passed
  (``PublishTimeout``: nothing was committed). A topic its owner marked for a bounded channel
  (``workers/domain/bounds.py``) fails at once with ``ChannelFull`` (overflow reject), or (overflow block) waits
  for the owner to clear the mark, at most ``BLOCK_WAIT`` seconds (and the caller's timeout), then ``ChannelFull``:
  the HTTP API's 503 ``CHANNEL_FULL``.
* ``command(op, topic, channel, timeout)`` sends a COMMAND record (slot, sequence number, op, names) to the topic's
  owner, which carries it out (``Worker.control_command``) and stores (sequence, status) in this slot's reply
  words; the caller waits for them (``LinkSet.wait_reply``: sleeping on the slot's eventfd, which the owner
  writes). -> a status of ``workers/control/commands.py``, or ``TIMEOUT`` when no answer came in time (the owner may be
  restarting: a replacement re-reads the ring and answers, so a retry with a new command is safe for these
  idempotent operations).

Sequence numbers start at the nanosecond clock (and above the slot's last answer), so a process taking over a slot
after a crash never mistakes an answer to its predecessor's command for one to its own. A process taking over a
slot also resumes its rings at their committed tails (producer recovery).

Resource handling: one ``ControlPlane`` per slot at a time (a ring has one writer); it is built from the ``Plan``
the process inherited from the supervisor (the links' mapping and eventfds). Calls are serialised by a lock (they
share the slot's eventfd for their waits).
"""
import os
import threading
import time
import zlib

import numpy as np

from nsqpy.ipc.ring import C_STALLED
from nsqpy.workers.control import commands as CMD
from nsqpy.workers.publishing.records import COMMAND, FORWARD, FORWARD_BY_FILE, forward_size, owner_of, pack_command, \
    pack_forward, set_want_room

TIMEOUT = -1          # command(): no answer within the timeout (a status of this client, not of an owner)
WAIT_SLICE = 0.05     # seconds: a publish waiting for room re-checks the owner's state at least this often
BLOCK_WAIT = 5.0      # seconds a publish waits for a channel at its limit (overflow block) before ChannelFull


class PublishFailed(RuntimeError):
    """The owner cannot take the publish (the topic is full, or it cannot store anything now); nothing of it was
    committed. The text is nsqd's E_PUB_FAILED reason."""


class ChannelFull(PublishFailed):
    """A channel of the topic is at its limit (workers/domain/bounds.py): refused (overflow reject) or not drained
    within BLOCK_WAIT (block). The text starts with CHANNEL_FULL, the HTTP API's error."""


class PublishTimeout(RuntimeError):
    """No room came in the ring to the owner within the timeout; nothing of the publish was committed."""


class ControlPlane:
    def __init__(self, plan, slot):
        links = plan.link_set
        if not plan.workers <= slot < links.producers:
            raise ValueError(f"producer slot {slot} is not a non-worker slot: [{plan.workers}, {links.producers})")
        self.links = links
        self.control = plan.control
        self.workers = plan.workers
        self.slot = slot
        self.proc = links.proc_of(slot)
        self._file_base = os.path.join(plan.data_path, f"{plan.prefix.strip('/')}fwd-{slot}-{os.getpid()}-")
        self._files = 0
        self._rings = [links.pub(slot, owner) for owner in range(plan.workers)]
        for link in self._rings:
            links.recover_writer(link)      # a predecessor in this slot may have died mid-record
            set_want_room(link.ring.ctl, 0)
        self._seq = max(links.last_seq(slot), time.time_ns())
        self._lock = threading.RLock()  # one sleeper on the slot's eventfd at a time

    # ---- publishing ------------------------------------------------------------------------------------
    def publish(self, topic, bodies, defer_ms=0, timeout=None):
        """Commit ``bodies`` (bytes-like, at least one) as one publish to ``topic``; returns once the owner's ring
        holds them (acknowledged). Raises PublishFailed (a real limit) or PublishTimeout (``timeout`` seconds,
        None: no limit, passed without room)."""
        if not bodies:
            raise ValueError("a publish needs at least one message")
        lengths = np.fromiter((len(b) for b in bodies), np.int64, len(bodies))
        src = np.frombuffer(b"".join(bodies), np.uint8)
        offsets = np.zeros(len(bodies), np.int64)
        np.cumsum(lengths[:-1], out=offsets[1:])
        name = topic.encode()
        crc = zlib.crc32(name)
        owner = owner_of(topic, self.workers)
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.control.topic_full(owner, crc):
            self._refuse_or_wait(owner, crc, topic, deadline)  # outside the lock: other topics' publishes go on
        with self._lock:
            payload = pack_forward(np.empty(forward_size(name, lengths), np.uint8), name, src, offsets, lengths,
                                   time.time_ns(), defer_ms)
            rtype = FORWARD
            if len(payload) > self._rings[owner].large_forward:
                payload, rtype = self._to_file(payload), FORWARD_BY_FILE
            try:
                self._commit(owner, rtype, payload, deadline, topic, crc)
            except BaseException:
                if rtype == FORWARD_BY_FILE:
                    _unlink(bytes(payload).decode())
                raise

    def _refuse_or_wait(self, owner, crc, topic, deadline):
        """The topic is marked: raise PublishFailed (its log is full) or ChannelFull (a channel at its limit with
        overflow reject), or wait while the mark says block, up to BLOCK_WAIT and the deadline (polled every
        WAIT_SLICE), then ChannelFull."""
        limit = time.monotonic() + BLOCK_WAIT
        if deadline is not None:
            limit = min(limit, deadline)
        while self.control.topic_full(owner, crc):
            why = self.control.refusal(owner, crc, topic)
            if why is not None:
                if why.startswith("channel "):
                    raise ChannelFull(f"CHANNEL_FULL: {why}")
                raise PublishFailed(why)
            wait = min(WAIT_SLICE, limit - time.monotonic())
            if wait <= 0:
                raise ChannelFull(f"CHANNEL_FULL: a channel of topic {topic} stayed at its limit for "
                                  f"{BLOCK_WAIT:g} s")
            time.sleep(wait)  # a poll: the slot's eventfd belongs to whoever holds the lock

    def _to_file(self, payload):
        self._files += 1
        path = f"{self._file_base}{self._files}.bin"
        try:
            with open(path, "xb") as f:
                f.write(memoryview(payload))
        except OSError as e:
            _unlink(path)
            raise PublishFailed(f"cannot hand over a publish of {len(payload)} bytes: {e}") from None
        return np.frombuffer(path.encode(), np.uint8)

    def _commit(self, owner, rtype, payload, deadline, topic=None, crc=None):
        """Commit one record to the ring to ``owner``, waiting for room as long as it takes (see the module
        docstring); the owner is woken after."""
        link = self._rings[owner]
        if link.send(rtype, payload):
            self.links.wake(owner)
            return
        ring = link.ring
        n = len(payload)
        set_want_room(ring.ctl, 1)  # fenced: the room checks below come after it (the owner then wakes us)
        try:
            while True:
                if link.send(rtype, payload):
                    self.links.wake(owner)
                    return
                if crc is not None and self.control.topic_full(owner, crc):
                    why = self.control.refusal(owner, crc, topic)
                    if why is not None:
                        raise ChannelFull(f"CHANNEL_FULL: {why}") if why.startswith("channel ") else \
                            PublishFailed(why)
                if ring.ctl[C_STALLED] or ring.out_of_pages:  # a real limit (see Worker._retry_parked)
                    raise PublishFailed(f"topic {topic} cannot be stored now: no space" if topic else
                                        f"worker {owner} cannot take records now")
                self.links.wake(owner)  # our records are there: make sure it is draining
                wait = WAIT_SLICE
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        raise PublishTimeout(f"no room towards worker {owner} in time")
                self.links.sleep(self.proc, wait, lambda: not ring.can_claim(n))
        finally:
            set_want_room(ring.ctl, 0)

    # ---- commands --------------------------------------------------------------------------------------
    def command(self, op, topic, channel=None, timeout=10.0):
        """Have the topic's owner carry out ``op`` (a name or code of workers/control/commands.py) -> its status, or
        TIMEOUT when none came within ``timeout`` seconds (which also bounds the wait for ring room)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            sent = self.send_command(op, topic, channel, timeout)
            if not isinstance(sent, tuple):
                return sent
            return self.await_reply(*sent, timeout=max(0.0, deadline - time.monotonic()))

    def send_command(self, op, topic, channel=None, timeout=10.0):
        """The first half of ``command``: -> (owner, sequence) once the command is in the owner's ring, or a
        status when it could not be sent (TIMEOUT: no room in time; FAILED: the owner cannot take records)."""
        code = CMD.OP_CODES.get(op, op)
        owner = owner_of(topic, self.workers)
        with self._lock:
            self._seq += 1
            seq = self._seq
            record = np.frombuffer(pack_command(self.slot, seq, code, topic, channel), np.uint8)
            try:
                self._commit(owner, COMMAND, record, time.monotonic() + timeout)
            except PublishTimeout:
                return TIMEOUT
            except PublishFailed:
                return CMD.FAILED
        return owner, seq

    def await_reply(self, owner, seq, timeout=10.0):
        """The second half: the status the owner stored for command ``seq``, or TIMEOUT. Only the latest command
        sent to an owner can be awaited (its answer overwrites the earlier ones')."""
        with self._lock:
            status = self.links.wait_reply(self.slot, owner, seq, timeout)
        return TIMEOUT if status is None else status


def _unlink(path):
    try:
        os.unlink(path)
    except OSError:
        pass
