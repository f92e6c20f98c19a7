"""Discovery through lookupd: URL and reply parsing, a scripted lookupd whose answer changes (a node that
appears later), and nsqpy's own nsqlookupd with an nsqd registering with it."""

import os
import re
import subprocess
import sys
import threading

import pytest

from nsqpy.client import Consumer, Producer
from nsqpy.client.lookupd import lookup_url, parse_producers
from tests.client.helpers import JsonServer, addr, unique, wait_until


def test_lookup_url_forms():
    assert lookup_url("127.0.0.1:4161", "t") == "http://127.0.0.1:4161/lookup?topic=t"
    assert lookup_url("http://h:1/custom?x=1", "t") == "http://h:1/custom?x=1&topic=t"
    assert lookup_url("https://h:1/", "a.b") == "https://h:1/lookup?topic=a.b"


def test_producers_parsed_from_both_reply_forms():
    modern = {"channels": [], "producers": [{"broadcast_address": "h1", "tcp_port": 4150},
                                            {"address": "h2", "tcp_port": 4250}, {"hostname": "no-port"}]}
    assert parse_producers(modern) == [("h1", 4150), ("h2", 4250)]
    assert parse_producers(None) == []


class FakeLookupd(JsonServer):
    """/lookup answers 404 TOPIC_NOT_FOUND until `producers` is set, then lists them (modern form)."""

    def __init__(self):
        self.producers = None
        self.queries = 0
        super().__init__(self._reply)

    def _reply(self, path):
        self.queries += 1
        if self.producers is None:
            return 404, {"message": "TOPIC_NOT_FOUND"}
        return 200, {"channels": [], "producers": self.producers}


def test_consumer_finds_a_node_that_appears_later_through_lookupd(shared_nsqd):
    lookupd = FakeLookupd()
    topic = unique("lookup")
    got = []
    c = Consumer(topic, "ch", lambda m: got.append(m.body), lookupd_http_addresses=[lookupd.address],
                 lookupd_poll_interval=0.1, lookupd_poll_jitter=0.1).start()
    try:
        wait_until(lambda: lookupd.queries >= 2, what="lookupd polled")
        assert c.connections == []
        lookupd.producers = [{"broadcast_address": shared_nsqd.host, "tcp_port": shared_nsqd.port,
                              "http_port": 0, "hostname": "x", "remote_address": "x", "version": "1.3.0"}]
        wait_until(lambda: len(c.connections) == 1, what="the consumer connected to the new node")
        with Producer([addr(shared_nsqd)]) as p:
            p.publish(topic, b"found")
        wait_until(lambda: got == [b"found"], what="the message")
        assert len(c.connections) == 1     # later polls do not dial the same node twice
    finally:
        c.stop()
        lookupd.close()


LISTEN = re.compile(r"(TCP|HTTP): listening on \[?([0-9.]+)\]?:(\d+)")


def _start_nsqlookupd():
    proc = subprocess.Popen([sys.executable, "-m", "nsqpy.http_api.lookupd.main", "--tcp-address=127.0.0.1:0",
                             "--http-address=127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    found = {}
    lines = []
    for line in proc.stdout:     # the listening lines come first; the process dying ends the loop
        lines.append(line)
        m = LISTEN.search(line)
        if m:
            found[m.group(1)] = f"{m.group(2)}:{m.group(3)}"
        if len(found) == 2:
            break
    if len(found) < 2:
        proc.kill()
        proc.wait()
        pytest.fail("nsqlookupd did not print its listening lines:\n" + "".join(lines))
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    return proc, found["TCP"], found["HTTP"]


def test_discovery_through_nsqpy_nsqlookupd(nsqd_factory):
    proc, tcp, http_address = _start_nsqlookupd()
    topic = unique("reallookup")
    got = []
    c = Consumer(topic, "ch", lambda m: got.append(m.body), lookupd_http_addresses=[http_address],
                 lookupd_poll_interval=0.2).start()
    try:
        node = nsqd_factory(f"--lookupd-tcp-address={tcp}", "--broadcast-address=127.0.0.1",
                            "--http-address=127.0.0.1:0", workers=1)   # appears later; registers with its HTTP port
        with Producer([addr(node)]) as p:
            p.publish(topic, b"via nsqlookupd")   # creates the topic, which nsqd registers with lookupd
        wait_until(lambda: got == [b"via nsqlookupd"], what="the message via lookupd discovery")
    finally:
        c.stop()
        proc.terminate()
        proc.wait(30)

