"""The control plane's transport (workers/control/client.py): a process that is not a worker publishes to topic owners
and sends them commands through its producer slot of the links.

The broker under test is nsqd's own start-up (this file run as a script: ``python test_controlplane.py SOCKET
<nsqd flags>``) with one more child forked by the supervisor, as an HTTP worker would be: the *client*, holding
producer slot ``workers`` (the first that is not a worker's) through a ``ControlPlane`` built from the inherited
Plan. It serves the test over a Unix socket, one JSON request per line, one JSON answer per line. Messages are
read back over TCP with ordinary consumers.

What is checked: publishes from the client are delivered (every worker's topics, several messages, by file when
bigger than the ring's share); a full ring makes a publish wait (a timeout proves it waited), and it completes once
the owner drains; a command is answered with the owner's status; a command to a stopped owner times out, and after
the owner is SIGKILLed its replacement answers the commands in its ring (the next command's answer is its own);
publishes acknowledged while the owner was stopped are all delivered after it was SIGKILLed and replaced.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if __name__ != "__main__":
    import pytest

    from tests.broker.conftest import LISTEN_RE, START_DEADLINE, Nsqd, _stop_all
    from tests.broker.wire import consumer, unique
    from nsqpy.workers.control import commands as CMD
    from nsqpy.workers.control.client import TIMEOUT


# ---- the broker with a client child (runs in the subprocess) ----------------------------------------------
CLIENT_LISTENING = b"harness client: listening"


def _client_main(plan, path, ready_fd):
    from nsqpy.workers.control.client import ControlPlane, PublishFailed, PublishTimeout
    cp = ControlPlane(plan, plan.workers)
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(path)
    srv.listen(4)
    os.write(ready_fd, b"c")
    os.write(1, CLIENT_LISTENING + b"\n")  # the test's sync point: TCP's line does not wait for this child

    def publish(req):
        try:
            cp.publish(req["topic"], [bytes.fromhex(b) for b in req["bodies"]], req.get("defer_ms", 0),
                       req.get("within"))
            return {"ok": True}
        except (PublishFailed, PublishTimeout) as e:
            return {"error": f"{type(e).__name__}: {e}"}

    def until_blocked(req):
        n = 0
        while True:
            body = f"{req['prefix']}{n}:".encode().ljust(req["size"], b".")
            try:
                cp.publish(req["topic"], [body], timeout=req["within"])
            except PublishTimeout:
                return {"acked": n}
            n += 1

    handlers = {
        "publish": publish,
        "until_blocked": until_blocked,
        "command": lambda r: {"status": cp.command(r["name"], r["topic"], r.get("channel"), r["within"])},
        "send_command": lambda r: {"sent": cp.send_command(r["name"], r["topic"], r.get("channel"), r["within"])},
        "await_reply": lambda r: {"status": cp.await_reply(r["owner"], r["seq"], r["within"])},
    }
    while True:
        conn, _ = srv.accept()
        with conn, conn.makefile("rwb") as f:
            for line in f:
                req = json.loads(line)
                try:
                    answer = handlers[req["op"]](req)
                except Exception:
                    import traceback
                    answer = {"exception": traceback.format_exc()}
                f.write(json.dumps(answer).encode() + b"\n")
                f.flush()


def _harness(argv):
    """nsqd's main, with the client child added to the supervisor once the plan exists."""
    from nsqpy.workers.processes import nsqd
    from nsqpy.workers.processes.plan import Plan
    from nsqpy.workers.processes.supervisor import Supervisor
    path, flags = argv[0], argv[1:]
    plans = []
    create, start = Plan.create, Supervisor.start

    def create_and_keep(self):
        create(self)
        plans.append(self)

    def start_with_client(self):
        self.add("client", lambda restarted, ready: _client_main(plans[0], path, ready))
        start(self)

    Plan.create, Supervisor.start = create_and_keep, start_with_client
    return nsqd.main(flags)


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(_harness(sys.argv[1:]))


# ---- the tests ---------------------------------------------------------------------------------------------
class Broker(Nsqd):
    """An Nsqd handle (output, stop, segments) for the harness broker, and a line-JSON connection to its client
    child."""

    def __init__(self, tmp_path, *flags, workers=2):
        data = tmp_path / "data"
        data.mkdir()
        self.data_path, self.node_id, self.workers = str(data), 7, workers
        self.client_path = str(tmp_path / "client.sock")
        self.lines = []
        self._cond = threading.Condition()
        args = ["--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={data}", f"--workers={workers}",
                "--node-id=7", *flags]
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), self.client_path, *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        with self.starting():
            m = self.wait_for_line(LISTEN_RE, START_DEADLINE)
            self.host, self.port = m.group(1), int(m.group(2))
            self.wait_for_line(CLIENT_LISTENING.decode(), START_DEADLINE)
            self.client = socket.socket(socket.AF_UNIX)
            self.client.connect(self.client_path)
        self.client_file = self.client.makefile("rwb")

    def ask(self, op, timeout=60.0, **req):
        self.send(op, **req)
        return self.answer(timeout)

    def send(self, op, **req):
        self.client_file.write(json.dumps({"op": op, **req}).encode() + b"\n")
        self.client_file.flush()

    def answer(self, timeout=60.0):
        self.client.settimeout(timeout)
        line = self.client_file.readline()
        assert line, "the client child closed the connection"
        answer = json.loads(line)
        assert "exception" not in answer, f"the client child raised:\n{answer['exception']}"
        return answer

    def worker_pid(self, index):
        return int(re.findall(rf"worker {index}: started \(pid (\d+)\)", self.output())[-1])


@pytest.fixture
def broker_factory(tmp_path):
    started = []

    def start(*flags, workers=2):
        sub = tmp_path / f"b{len(started)}"
        sub.mkdir()
        b = Broker(sub, *flags, workers=workers)
        started.append(b)
        return b

    yield start
    for b in started:
        b.client.close()
    _stop_all(started)


def owned_by(worker, workers, prefix="cp"):
    return next(t for t in (unique(prefix) for _ in range(1000)) if zlib.crc32(t.encode()) % workers == worker)


def read_bodies(address, topic, n):
    with consumer(address, topic, "ch", rdy=min(n, 2500)) as c:
        bodies = []
        for _ in range(n):
            m = c.read_message(timeout=60)
            bodies.append(m.body)
            c.send(b"FIN " + m.id + b"\n")
        c.expect_no_frame(within=0.3)
    return bodies


def hexes(*bodies):
    return [b.hex() for b in bodies]


def test_publishes_from_a_non_worker_process_are_delivered(broker_factory):
    """To each worker's topics: one message, then three in one publish, then a deferred one (0 ms); all arrive in
    order. A publish bigger than the ring's share goes by file (256 KiB rings here: above 32 KiB)."""
    b = broker_factory("--ring-budget=1048576")
    for w in range(b.workers):
        topic = owned_by(w, b.workers)
        assert b.ask("publish", topic=topic, bodies=hexes(b"one")) == {"ok": True}
        assert b.ask("publish", topic=topic, bodies=hexes(b"two", b"three", b"four")) == {"ok": True}
        assert b.ask("publish", topic=topic, bodies=hexes(b"five"), defer_ms=0) == {"ok": True}
        big = [bytes([65 + i]) * 200_000 for i in range(3)]
        assert b.ask("publish", topic=topic, bodies=hexes(*big)) == {"ok": True}
        assert read_bodies(b.address, topic, 8) == [b"one", b"two", b"three", b"four", b"five", *big]
    assert not [f for f in os.listdir(b.data_path) if "fwd-" in f], "a file of a large publish was left behind"


def test_a_command_is_answered_with_the_owners_status(broker_factory):
    b = broker_factory()
    for w in range(b.workers):
        topic = owned_by(w, b.workers)
        assert b.ask("command", name="topic_create", topic=topic, within=30) == {"status": CMD.OK}
        assert b.ask("command", name="channel_delete", topic=topic, channel="nope",
                     within=30) == {"status": CMD.CHANNEL_NOT_FOUND}
        assert b.ask("command", name="channel_create", topic=topic, channel="ch", within=30) == {"status": CMD.OK}
        # the channel exists before any message: one published now reaches it
        assert b.ask("publish", topic=topic, bodies=hexes(b"after")) == {"ok": True}
        assert read_bodies(b.address, topic, 1) == [b"after"]


LAST = b"last:".ljust(16 * 1024, b".")


def test_a_full_ring_makes_a_publish_wait_until_the_owner_drains(broker_factory):
    """The owner stopped: the client publishes until its ring is full (a publish with a 1 s timeout then times out:
    it waited, it did not fail); a publish without timeout is still waiting when the owner runs again, and then
    completes. Everything acknowledged is delivered, nothing else."""
    b = broker_factory("--ring-budget=1048576")  # 256 KiB rings
    topic = owned_by(1, b.workers)
    assert b.ask("publish", topic=topic, bodies=hexes(b"first")) == {"ok": True}
    owner = b.worker_pid(1)
    os.kill(owner, signal.SIGSTOP)
    try:
        acked = b.ask("until_blocked", topic=topic, prefix="m", size=16 * 1024, within=1.0)["acked"]
        assert acked > 0
        b.send("publish", topic=topic, bodies=hexes(LAST))  # as big as those that filled the ring
        assert select.select([b.client], [], [], 0.5)[0] == [], "the publish did not wait for room"
    finally:
        os.kill(owner, signal.SIGCONT)
    assert b.answer() == {"ok": True}
    want = [b"first"] + [f"m{n}:".encode().ljust(16 * 1024, b".") for n in range(acked)] + [LAST]
    assert read_bodies(b.address, topic, len(want)) == want


@contextlib.contextmanager
def stopped_then_killed(pid):
    """SIGSTOP pid for the block; SIGKILL it when the block succeeds (its replacement takes over), else let it
    run on (SIGCONT) so the broker can stop cleanly."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    except BaseException:
        os.kill(pid, signal.SIGCONT)
        raise
    os.kill(pid, signal.SIGKILL)


def test_a_command_to_a_stopped_owner_times_out_and_its_replacement_answers(broker_factory):
    b = broker_factory()
    topic = owned_by(1, b.workers)
    with stopped_then_killed(b.worker_pid(1)):  # with both commands in its ring, unanswered
        assert b.ask("command", name="topic_create", topic=topic, within=1.0) == {"status": TIMEOUT}
        owner_seq = b.ask("send_command", name="channel_create", topic=topic, channel="ch", within=5)["sent"]
        assert owner_seq[0] == 1
    assert b.ask("await_reply", owner=1, seq=owner_seq[1], within=60) == {"status": CMD.OK}
    assert b.ask("command", name="channel_delete", topic=topic, channel="nope",
                 within=30) == {"status": CMD.CHANNEL_NOT_FOUND}  # its own answer, not a late one
    assert b.ask("publish", topic=topic, bodies=hexes(b"x")) == {"ok": True}
    assert read_bodies(b.address, topic, 1) == [b"x"]


def test_publishes_acknowledged_before_the_owner_is_killed_are_delivered(broker_factory):
    b = broker_factory()
    topic = owned_by(1, b.workers)
    with stopped_then_killed(b.worker_pid(1)):
        for k in range(20):
            assert b.ask("publish", topic=topic, bodies=hexes(b"m%d" % k)) == {"ok": True}
    assert read_bodies(b.address, topic, 20) == [b"m%d" % k for k in range(20)]


def test_control_commands_take_effect_for_live_clients(broker_factory):
    """NSQ's effects (spec 2.2), seen by real consumers: pause stops delivery and unpause resumes it (channel and
    topic), channel empty drops what waits and what is in flight, topic empty drops the backlog kept for a topic's
    first channel, delete closes the consumers; unknown names get their status."""
    from tests.broker.wire import Conn, producer

    b = broker_factory()
    addr = b.address

    def command(name, topic, channel=None):
        return b.ask("command", name=name, topic=topic, channel=channel, within=30)["status"]

    topic = owned_by(1, b.workers)
    with consumer(addr, topic, "ch", rdy=10) as c:
        producer(addr, topic, b"a")
        assert c.read_message().body == b"a"
        assert command("channel_pause", topic, "ch") == CMD.OK
        producer(addr, topic, b"b")
        c.expect_no_frame(0.3)  # ends with a sync point on c
        assert command("channel_unpause", topic, "ch") == CMD.OK
        assert c.read_message().body == b"b"
        assert command("topic_pause", topic) == CMD.OK
        producer(addr, topic, b"c")
        c.expect_no_frame(0.3)
        assert command("topic_unpause", topic) == CMD.OK
        held = c.read_message()
        assert held.body == b"c"
        c.send(b"RDY 0\n")
        producer(addr, topic, b"d", b"e")
        assert command("channel_empty", topic, "ch") == CMD.OK  # "d", "e" waiting and "c" in flight: gone
        c.send(b"FIN " + held.id + b"\n")
        c.expect_error("E_FIN_FAILED")
        c.send(b"RDY 10\n")
        c.expect_no_frame(0.3)
        producer(addr, topic, b"f")
        assert c.read_message().body == b"f"
        assert command("channel_delete", topic, "ch") == CMD.OK
        c.expect_closed()
    assert command("channel_delete", topic, "ch") == CMD.CHANNEL_NOT_FOUND

    lonely = owned_by(0, b.workers)
    producer(addr, lonely, b"backlog")
    assert command("topic_empty", lonely) == CMD.OK
    with consumer(addr, lonely, "ch", rdy=10) as c:
        c.expect_no_frame(0.3)
        producer(addr, lonely, b"fresh")
        assert c.read_message().body == b"fresh"
        assert command("topic_delete", lonely) == CMD.OK
        c.expect_closed()
    assert command("topic_delete", lonely) == CMD.TOPIC_NOT_FOUND
    assert command("topic_pause", unique("never")) in (CMD.TOPIC_NOT_FOUND,)
    with Conn(addr) as p:  # the broker still serves
        p.publish(lonely, b"again")
