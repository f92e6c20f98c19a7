"""Property: whatever a consumer does with what it is given, every message answered OK is delivered (at least
once) and the broker lives.

Each hypothesis example uses a fresh topic on ONE broker for the module (--max-msg-size=2097152, so messages up
to 2 MiB, and --max-body-size big enough for an MPUB of five of them). It draws:
* publishes: PUB (one message) or MPUB (2-5) batches of sizes 1..max-msg-size, mostly small, some near the limit;
  and maybe one empty PUB, which must be refused with E_BAD_MESSAGE (NSQ's rule: a body of 0 bytes is invalid);
* whether the consumer subscribes before or after the publishes, and its RDY (1..100);
* a list of actions, applied to the deliveries in order: FIN, REQ 0, REQ with a small delay, disconnect (RST,
  whatever the connection holds comes back), timeout (ignore it: the consumer IDENTIFYs with msg_timeout 1000 ms),
  or SIGKILL every worker (at most once per example; later ones act as a disconnect). When the list runs out, or
  a message has been delivered three times, the consumer FINs.

The example ends when, for every body published, the consumer has FINned as many distinct message IDs carrying
it as were acknowledged; a message that does not come back within ``WAIT`` fails it, naming what is missing.
Then a sync point (a PUB answered OK on the consumer connection), and the broker must still run, never have
logged "giving up", and have lost no process but the workers the test killed.

Shrinking is off (``phases``): examples share one broker, so after a failure that broke it every smaller
example would fail as well, and shrinking would only burn minutes; hypothesis prints the failing example.
"""
from __future__ import annotations

import collections
import random
import re
import socket
import struct

import pytest
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

from namespaces import kill_workers, log_on_failure
from nsqpy.protocol import client as C
from nsqpy.protocol.frames import FRAME_ERROR, FRAME_MESSAGE, FRAME_RESPONSE
from wire import Conn, unique

KIB, MIB = 1 << 10, 1 << 20
MAX = 2 * MIB
FLAGS = [f"--max-msg-size={MAX}", "--max-body-size=16777216"]
WAIT = 30.0
PLAY_ATTEMPTS = 3
ACTIONS = ("fin", "req0", "req_delay", "disconnect", "timeout", "kill")
NON_FATAL = (b"E_FIN_FAILED", b"E_REQ_FAILED", b"E_TOUCH_FAILED")

sizes = st.one_of(
    st.integers(1, 64), st.integers(1, 64), st.integers(1, 64),
    st.integers(65, 16 * KIB), st.integers(65, 16 * KIB),
    st.integers(16 * KIB, MAX - 4 * KIB),
    st.integers(MAX - 4 * KIB, MAX),
)


@st.composite
def scenarios(draw):
    return {
        "batches": draw(st.lists(st.lists(sizes, min_size=1, max_size=5), min_size=1, max_size=8)),
        "empty_pub": draw(st.booleans()),
        "subscribe_first": draw(st.booleans()),
        "rdy": draw(st.one_of(st.integers(1, 5), st.integers(1, 100))),
        "actions": draw(st.lists(st.sampled_from(ACTIONS), max_size=20)),
        "seed": draw(st.integers(0, 2 ** 32 - 1)),
    }


@pytest.fixture(scope="module")
def broker(module_nsqd_factory):
    return module_nsqd_factory(*FLAGS)


_examples = iter(range(1 << 30))
_killed: set[int] = set()


def make_bodies(batches, example, rng):
    out = []
    for b, batch in enumerate(batches):
        bodies = []
        for i, size in enumerate(batch):
            tag = struct.pack("<IHH", example, b, i)
            bodies.append((tag + rng.randbytes(size))[:size] if size >= len(tag) else rng.randbytes(size))
        out.append(bodies)
    return out


def publish(address, topic, batches):
    with Conn(address) as p:
        p.sock.settimeout(WAIT)
        for bodies in batches:
            p.send(C.pub(topic, bodies[0]) if len(bodies) == 1 else C.mpub(topic, bodies))
            p.expect_response(b"OK", timeout=WAIT)


def abort(conn):
    """Close with RST: the broker sees the connection die with whatever it held in flight."""
    try:
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    conn.close()


class Consumer:
    def __init__(self, nsqd, topic, rdy):
        self.nsqd, self.topic, self.rdy = nsqd, topic, rdy
        self.conn = None
        self.may_close = False   # set after a kill: this connection dies with its worker

    def connect(self):
        if self.conn is None:
            self.may_close = False
            c = Conn(self.nsqd.address)
            c.identify(msg_timeout=1000)
            c.subscribe(self.topic, "ch", rdy=self.rdy)
            self.conn = c
        return self.conn

    def drop(self):
        if self.conn is not None:
            abort(self.conn)
            self.conn = None

    def send(self, data):
        try:
            self.conn.send(data)
        except OSError:
            assert self.may_close, "the broker closed the consumer's connection"
            self.drop()

    def next_message(self):
        """The next message, or None if the connection closed (allowed only after a kill)."""
        c = self.connect()
        while True:
            frame = c.next_frame(timeout=WAIT)
            if frame is None:
                assert self.may_close, "the broker closed the consumer's connection"
                self.drop()
                return None
            if frame[0] == FRAME_ERROR and frame[1].split(b" ", 1)[0] in NON_FATAL:
                continue  # a FIN/REQ that came after the message's timeout: it is redelivered
            assert frame[0] == FRAME_MESSAGE, f"expected a message, got {frame!r:.300}"
            return C.decode_message(frame[1])


def check_broker(nsqd):
    out = nsqd.output()
    assert nsqd.proc.poll() is None, f"nsqd exited with {nsqd.proc.returncode}"
    assert "giving up" not in out
    died = [(int(pid), how) for pid, how in re.findall(r"\(pid (\d+)\) died \((.*?)\)", out)
            if not (int(pid) in _killed and how == "signal 9")]
    assert not died, f"processes of the broker died (pid, how): {died}"


def run_example(nsqd, sc):
    example = next(_examples)
    rng = random.Random(sc["seed"])
    topic = unique("prop")
    batches = make_bodies(sc["batches"], example, rng)
    expected = collections.Counter(b for batch in batches for b in batch)
    if sc["empty_pub"]:
        with Conn(nsqd.address) as p:
            p.send(C.pub(topic, b""))
            p.expect_fatal("E_BAD_MESSAGE")
    consumer = Consumer(nsqd, topic, sc["rdy"])
    if sc["subscribe_first"]:
        consumer.connect()
    publish(nsqd.address, topic, batches)
    actions = iter(sc["actions"])
    killed = False
    finned = collections.defaultdict(set)   # body -> ids FINned

    def missing():
        return {b[:16]: n - len(finned[b]) for b, n in expected.items() if len(finned[b]) < n}

    try:
        while missing():
            try:
                m = consumer.next_message()
            except AssertionError as e:
                raise AssertionError(f"{e}; still missing (first bytes: count) {missing()}") from None
            if m is None:
                continue
            assert m.body in expected, f"a body arrived that was not published ({len(m.body)} bytes)"
            action = next(actions, "fin") if m.attempts < PLAY_ATTEMPTS else "fin"
            if consumer.conn is None:
                continue  # read before the connection died with its worker
            if action == "fin":
                consumer.send(C.fin(m.id))
                finned[m.body].add(m.id)
            elif action == "req0":
                consumer.send(C.req(m.id, 0))
            elif action == "req_delay":
                consumer.send(C.req(m.id, rng.choice((1, 10, 50, 200))))
            elif action == "timeout":
                pass
            elif action == "disconnect" or killed:
                consumer.drop()
            else:  # kill: every worker, so the topic's owner too; the connection dies with its worker
                killed = True
                check_broker(nsqd)  # a worker that died by itself fails as such, not as a failed kill
                _killed.update(kill_workers(nsqd))
                consumer.may_close = True
        consumer.drop()  # a fresh connection: the current one may have died with a killed worker unnoticed
        c = consumer.connect()
        c.send(C.pub(unique("sync"), b"sync"))
        while True:
            frame = c.expect_frame(WAIT)
            if frame[0] == FRAME_MESSAGE:  # a redelivery past what we needed (at least once): finish it
                c.send(C.fin(C.decode_message(frame[1]).id))
            elif frame[0] == FRAME_ERROR and frame[1].split(b" ", 1)[0] in NON_FATAL:
                continue
            else:
                assert frame == (FRAME_RESPONSE, b"OK"), frame
                break
    finally:
        consumer.drop()
    check_broker(nsqd)
    event(f"messages: {sum(expected.values())}, the largest {max(map(len, expected)) // KIB} KiB")
    event(f"workers killed: {killed}")


@settings(max_examples=25, deadline=None, database=None, phases=(Phase.explicit, Phase.generate),
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(sc=scenarios())
# always tried first: more than 8 MiB in flight on one consumer (five messages at the limit), all requeued at once
@example(sc={"batches": [[MAX] * 5], "empty_pub": True, "subscribe_first": True, "rdy": 100,
             "actions": ["fin", "disconnect"], "seed": 1})
@example(sc={"batches": [[MAX] * 5, [1, 100, 5000]], "empty_pub": False, "subscribe_first": False, "rdy": 8,
             "actions": ["timeout", "req0", "req0", "req_delay", "kill"], "seed": 2})
@pytest.mark.timeout(600)
def test_every_acknowledged_message_is_delivered(broker, sc):
    with log_on_failure(broker, lines=60):
        run_example(broker, sc)
