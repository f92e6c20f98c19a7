"""The HTTP API's processes are supervised: a gunicorn worker SIGKILLed under /pub load is replaced and loses no
message it answered 200 OK for; a SIGKILLed arbiter takes its workers with it and is replaced by nsqd's
supervisor on the same port. Also statsd: the pusher's UDP datagrams, received by a listener in the test."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time

from tests.broker.wire import consumer, producer, unique
from tests.http.conftest import Http, request

DEADLINE = 60.0
HTTP_CHILD_RE = re.compile(r"INFO: http: started \(pid (\d+)\)")


def until(cond, what, timeout=DEADLINE):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} did not hold within {timeout} s"
        time.sleep(0.02)  # polling a condition with a deadline


def children(pid):
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return sorted(int(x) for x in out.split())


def http_child(nsqd):
    """The pid of the current gunicorn arbiter (the supervisor's "http" child)."""
    return int(HTTP_CHILD_RE.findall(nsqd.output())[-1])


class Publishers:
    """Threads publishing distinct bodies over keep-alive connections, recording each one answered 200 OK.
    A connection that breaks (its worker was killed) is replaced; the publish is not counted."""

    def __init__(self, api, topic, n=4):
        self.api, self.topic = api, topic
        self.ok = []
        self.failed = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, i):
        h = Http(self.api, timeout=30)
        k = 0
        while not self.stop.is_set():
            body = b"p%d-%d" % (i, k)
            k += 1
            try:
                status, _, _ = h.request("POST", f"/pub?topic={self.topic}", body)
            except Exception:  # a broken connection (its worker was killed), or a half-read reply
                self.failed += 1
                h.close()
                h = Http(self.api, timeout=30)
                continue
            if status == 200:
                self.ok.append(body)
        h.close()

    def join(self):
        self.stop.set()
        for t in self.threads:
            t.join()


def test_killed_gunicorn_worker_loses_no_acknowledged_publish(nsqd_factory):
    nsqd = nsqd_factory("--http-workers=2")
    api = nsqd.http_address
    topic = unique("kill")
    arbiter = http_child(nsqd)
    workers = until(lambda: len(w := children(arbiter)) == 2 and w, "two gunicorn workers")
    with consumer(nsqd.address, topic, "c", rdy=2500) as c:  # the channel exists before the first publish
        pubs = Publishers(api, topic)
        try:
            until(lambda: len(pubs.ok) >= 200, "publishes before the kill")
            os.kill(workers[0], signal.SIGKILL)
            before = len(pubs.ok)
            until(lambda: (w := children(arbiter)) and len(w) == 2 and workers[0] not in w, "a replacement worker")
            until(lambda: len(pubs.ok) >= before + 200, "publishes after the kill")
            os.kill(children(arbiter)[-1], signal.SIGKILL)  # the replacement's slot, taken over once more
            before = len(pubs.ok)
            until(lambda: len(pubs.ok) >= before + 100, "publishes after the second kill")
        finally:
            pubs.join()
        acked = set(pubs.ok)
        assert len(acked) == len(pubs.ok)
        got = set()
        deadline = time.monotonic() + DEADLINE
        while not acked <= got:
            assert time.monotonic() < deadline, f"{len(acked - got)} acknowledged messages never delivered"
            m = c.read_message()
            got.add(m.body)
            c.send(b"FIN " + m.id + b"\n")
    assert request(api, "GET", "/ping")[2] == b"OK"


def test_killed_arbiter_is_replaced_on_the_same_port(nsqd_factory):
    nsqd = nsqd_factory("--http-workers=1")
    api = nsqd.http_address
    arbiter = http_child(nsqd)
    [worker] = until(lambda: children(arbiter), "a gunicorn worker")
    os.kill(arbiter, signal.SIGKILL)
    until(lambda: not os.path.exists(f"/proc/{worker}") or _zombie(worker), "its worker died with it")
    until(lambda: http_child(nsqd) != arbiter, "a new arbiter")
    topic = unique("arb")
    with consumer(nsqd.address, topic, "c", rdy=1) as c:
        assert request(api, "POST", f"/pub?topic={topic}", b"after")[0] == 200
        assert c.read_message().body == b"after"


def _zombie(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True


def test_statsd_datagrams(nsqd_factory):
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(DEADLINE)
    port = udp.getsockname()[1]
    with udp:
        nsqd = nsqd_factory(f"--statsd-address=127.0.0.1:{port}", "--statsd-interval=1s", "--statsd-prefix=t.%s",
                            "--statsd-udp-packet-size=200", "--broadcast-address=h.example")
        topic = unique("sd")
        producer(nsqd.address, topic, b"a", b"b", b"c")
        api = nsqd.http_address
        prefix = f"t.h_example_{api[1]}."
        lines = []
        deadline = time.monotonic() + DEADLINE
        want = f"{prefix}topic.{topic}.message_count:"
        mem = f"{prefix}mem.heap_in_use_bytes:"

        def seen():  # the push with our topic, through to its memory lines (they come last)
            at = [i for i, line in enumerate(lines) if line.startswith(want) and not line.endswith(":0|c")]
            return at and any(line.startswith(mem) for line in lines[at[0]:])

        while not seen():
            assert time.monotonic() < deadline, lines[-20:]
            data, _ = udp.recvfrom(65536)
            assert len(data) <= 200 and data.endswith(b"\n")
            lines += data.decode().splitlines()
        assert f"{want}3|c" in lines
        assert f"{prefix}topic.{topic}.depth:3|g" in lines
