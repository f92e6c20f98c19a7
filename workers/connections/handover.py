"""A worker's connections: how they arrive (from the acceptor), move between workers (a consumer at SUB, a
round-trip producer to its topics' owner) and leave.

Theory of operation: a connection travels as its socket (SCM_RIGHTS over the receiving worker's hand-over
channel) plus a JSON blob of what the session negotiated, the replies it had not sent yet and, for a subscriber,
the bytes read after SUB. The sending worker flushes first and forgets the socket only once the hand-over was
sent; the receiving one builds a fresh Session around it.

``Connections`` is one part of ``nsqpy.workers.processes.worker.Worker``. It owns the worker's sessions (by connection
id; the dict is never rebound, others read it) and the connection-id sequence. It is built with what it uses: the
host handed to each Session (the worker: ``Session(host, ...)``; Session declares what it uses of it), the
worker's hand-over channel and every worker's (``inboxes``), the loop, the log, the control block, the pump
(``settle`` before a hand-over), the parser limits, the placement policy with its ``OwnerNaps``, and the topic
table's ``subscribe`` (``Subscriber``) for a subscriber moved here.
"""
import json
import socket
import time
from typing import Protocol

import numpy as np
from numba import njit

from nsqpy.ipc.numba_cache import JIT, warm_up_step
from nsqpy.ipc.fdpass import PeerGone
from nsqpy.workers.connections.auth import AuthState
from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.identify import ClientSettings
from nsqpy.protocol.states import STATE_SUBSCRIBED
from nsqpy.protocol.v2_parser import V2Parser
from nsqpy.workers.lane.pump import AUTO
from nsqpy.workers.publishing.records import owner_of  # noqa: F401 (imported from here too)
from nsqpy.workers.domain.session import Session

NEW_CONNECTION, MOVED_SUBSCRIBER, MOVED_PRODUCER = 1, 2, 3
MOVE_IN_CAP = 4   # auto placement: producers other workers may move to one owner (it counts them in the control block)
NAP_WINDOW = 64   # forwards to an owner per look at how many of them found it asleep
NAPS_FORWARDS, NAPS_WOKE, NAPS_IDLE = range(3)  # rows of OwnerNaps.naps


@njit(**JIT)
def owner_nap(naps, owner, woke):
    """One forward to ``owner`` (``woke``: it had to be woken) in ``OwnerNaps.naps``; shared by the Python path and
    the compiled forward lane (workers/lane/fastlane.py)."""
    naps[NAPS_WOKE, owner] += woke
    naps[NAPS_FORWARDS, owner] += 1
    if naps[NAPS_FORWARDS, owner] == NAP_WINDOW:
        naps[NAPS_IDLE, owner] = 1 if 2 * naps[NAPS_WOKE, owner] >= NAP_WINDOW else 0
        naps[NAPS_FORWARDS, owner] = 0
        naps[NAPS_WOKE, owner] = 0


class OwnerNaps:
    """Whether each owner had idle time lately: of the last full window of NAP_WINDOW forwards to it, how many had
    to wake it (it was asleep: its loop had nothing to do). A worker knows this for free from the wake-up it
    issues after every forward (``LinkSet.wake``), and auto placement moves a slow producer to an owner only while
    at least half of them did: a busy owner gets no more producers. One int64 row per counter (NAPS_*), one
    column per owner, so compiled code counts its forwards in the same place."""

    def __init__(self, workers):
        self.naps = np.zeros((3, workers), np.int64)
        self.idle = self.naps[NAPS_IDLE]

    def saw(self, owner, woke):
        owner_nap(self.naps, owner, 1 if woke else 0)


class Subscriber(Protocol):
    """The topic table (``workers/domain/topics.py``): SUB of a session, here or (MIGRATED) at the owner."""

    def subscribe(self, s, topic: str, channel: str): ...


class Connections:
    def __init__(self, host, index, workers, inboxes, loop, log, control, pump, limits, placement,
                 owner_naps: OwnerNaps, subscriber: Subscriber):
        self.host = host
        self.index = index
        self.workers = workers
        self.inboxes = inboxes
        self.inbox = inboxes[index][0]
        self.loop = loop
        self.log = log
        self.control = control
        self.pump = pump
        self.limits = limits
        self.placement = placement
        self.owner_naps = owner_naps
        self.subscriber = subscriber
        self.sessions = {}
        self.conn_seq = (int(time.time()) & 0xFFFFF) << 24

    def on_handoff(self):
        while True:
            try:
                msg = self.inbox.try_recv()
            except PeerGone:
                self.loop.remove_reader(self.inbox.fileno())
                return
            except Exception as e:  # a malformed hand-over: its fds were closed, carry on
                self.log.error(f"bad hand-over: {e}")
                continue
            if msg is None:
                return
            sock = socket.socket(fileno=msg.fd)
            sock.setblocking(False)
            try:
                if sock.family == socket.AF_UNIX:  # a relayed TLS/compressed client (workers/connections/transport.py):
                    remote = None                  # its address travels in the blob
                else:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    remote = sock.getpeername()[:2]
            except OSError:  # the client left before we took it
                sock.close()
                self._lost_hand_over(msg.kind, msg.blob)
                continue
            if msg.kind == NEW_CONNECTION:
                self._new_session(sock, remote, msg.blob)
            else:
                self._moved_session(sock, remote, msg.kind, msg.blob)

    def _next_conn(self):
        self.conn_seq += 1
        return self.conn_seq

    def _new_session(self, sock, remote, first_bytes=b""):
        s = Session(self.host, sock, self._next_conn(), remote)
        self.sessions[s.conn_id] = s
        self.control.add_connections(self.index, 1)
        self.log.info(f"TCP: new client({remote[0]}:{remote[1]})")
        s.start(first_bytes)

    def migrate(self, s, sub, rest):
        """Hand a connection that just sent SUB to the topic's owner, with its state and unparsed bytes."""
        self._hand_over(s, owner_of(sub.topic, self.workers), MOVED_SUBSCRIBER,
                        {"topic": sub.topic, "channel": sub.channel, "rest": rest.hex()})

    def move_producer(self, s, owner):
        """The pump saw this producer's last lone PUBs all go to topics of worker ``owner`` (slowly, with auto
        placement): hand it there, so its PUBs are appended where they arrive instead of crossing a ring. owner
        -1: this worker owns its topics and it was moved here, but publishes fast now (or this worker is busy and
        serves other producers moved in): hand it to the least loaded other worker, so busy producers spread (see
        ARCHITECTURE.md, "Single PUB: cost model")."""
        if s.closed or s.closing_after_flush or s.channel is not None or not s.parser.idle or not s.reading \
                or s.held:  # a publish of it waits for room in a ring: its OK must come from here
            return
        to_owner = owner >= 0
        if not to_owner:
            owner = self.control.least_loaded(besides=self.index)
        elif self.placement == AUTO and not (self.owner_naps.idle[owner] and not self.control.busy(owner)
                                             and self.control.moved_in(owner) < MOVE_IN_CAP):
            return  # the owner is busy or has its share of moved producers: stay (the pump asks again later)
        if to_owner:
            self.control.add_moved_in(owner, 1)  # counted now, so one batch of movers cannot overshoot the cap
        extra = {"parser_state": s.parser.state, "moved_in": to_owner,
                 "took_before": float(self.pump.took_before[s.fd]), "stay_out": s.stay_out or not to_owner}
        if not self._hand_over(s, owner, MOVED_PRODUCER, extra) and to_owner:
            self.control.add_moved_in(owner, -1)

    def _hand_over(self, s, owner, kind, extra):
        s.flush()
        self.pump.settle(s)
        state = {
            "settings": {f: getattr(s.settings, f) for f in s.settings.__dataclass_fields__},
            "connect_ts": s.connect_ts, "unsent": bytes(s.wbuf).hex(), "pub_counts": s.pub_counts, **extra,
            "remote": list(s.remote), "auth": s.auth.blob() if s.auth is not None else None,
            "auth_secret": s.auth_secret.hex() if s.auth_secret is not None else None,
            "common_name": s.common_name, "stats_extra": s.stats_extra,
        }
        blob = json.dumps(state).encode()
        try:
            self.inboxes[owner][1].send(kind, s.conn_id, blob, s.fd, timeout=5)
        except Exception as e:
            self.log.error(f"could not hand {s.remote_text} to worker {owner}: {e}")
            s.close()
            return False
        s.detach()
        s.sock.close()
        role = "subscriber" if kind == MOVED_SUBSCRIBER else "producer"
        self.log.debug(f"worker {self.index}: handed {role} {s.remote_text} to worker {owner}")
        return True

    def _lost_hand_over(self, kind, blob):
        """A producer moved here as its topics' owner that is gone before this worker took it: give its place under
        MOVE_IN_CAP back (its sender counted it at the hand-over; forget_session would have, had it arrived)."""
        if kind != MOVED_PRODUCER:
            return
        try:
            moved = json.loads(blob).get("moved_in")
        except ValueError:
            return
        if moved:
            self.control.add_moved_in(self.index, -1)

    def _moved_session(self, sock, remote, kind, blob):
        state = json.loads(blob)
        if remote is None:
            remote = tuple(state["remote"])
        settings = ClientSettings(**state["settings"])
        if kind == MOVED_SUBSCRIBER:
            parser = V2Parser(self.limits, expect_magic=False, state=STATE_SUBSCRIBED, stop_after_sub=True)
        else:
            parser = V2Parser(self.limits, expect_magic=False, state=state["parser_state"], stop_after_sub=True)
        s = Session(self.host, sock, self._next_conn(), remote, parser, settings, state["connect_ts"])
        s.pub_counts = state["pub_counts"]
        if state.get("auth") is not None:
            s.auth = AuthState.from_blob(state["auth"])
        if state.get("auth_secret") is not None:
            s.auth_secret = bytes.fromhex(state["auth_secret"])
        s.common_name = state.get("common_name", "")
        s.stats_extra = state.get("stats_extra")
        if state.get("moved_in"):
            s.moved_in = True  # before start: the pump learns it with the fd (the sender counted it already)
            s.moved_in_took = float(state.get("took_before", 0.0))
        s.stay_out = bool(state.get("stay_out"))  # moved out of an owner once: auto does not move it in again
        self.sessions[s.conn_id] = s
        self.control.add_connections(self.index, 1)
        s.start()
        unsent = bytes.fromhex(state["unsent"])
        if unsent:
            s.write(unsent)  # after start: the pump knows the fd now, and marks it busy
        if kind != MOVED_SUBSCRIBER:
            return
        self.log.debug(f"worker {self.index}: took over {remote} for {state['topic']}")
        try:
            self.subscriber.subscribe(s, state["topic"], state["channel"])
        except ProtocolError as err:
            s._fail(err)
            return
        rest = bytes.fromhex(state["rest"])
        if rest:
            s.on_data(rest)

    def forget_session(self, s):
        if self.sessions.pop(s.conn_id, None) is not None:
            self.control.add_connections(self.index, -1)
            if s.moved_in:
                self.control.add_moved_in(self.index, -1)


@warm_up_step
def warm_up():
    """The Python path's count of a forward (workers/publishing/forwarding.py; the lane's is compiled with it)."""
    OwnerNaps(2).saw(1, True)
