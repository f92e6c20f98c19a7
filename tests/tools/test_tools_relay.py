"""nsq_to_http, nsq_to_nsq and nsq_stat end to end (nsq_stat also through a real nsqlookupd, with nsqds that stop
answering or leave)."""

import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading

from nsqpy.client import Consumer, Producer
from tests.client.helpers import JsonServer, addr, unique, wait_until
from tests.client.test_client_lookupd import _start_nsqlookupd
from tests.tools.test_tools_pipeline import Tool


class Receiver:
    """An HTTP server recording requests; answers 500 to the first `fail_first` of them."""

    def __init__(self, fail_first=0):
        self.requests = []
        self.fail_first = fail_first
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _record(self, body):
                owner.requests.append((self.command, self.path, dict(self.headers), body))
                status = 500 if len(owner.requests) <= owner.fail_first else 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self):
                self._record(b"")

            def do_POST(self):
                self._record(self.rfile.read(int(self.headers["Content-Length"])))

            def log_message(self, *args):
                pass
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_nsq_to_http_post_and_get(shared_nsqd):
    topic = unique("http")
    posts, gets = Receiver(fail_first=1), Receiver()
    tools = [Tool("nsq_to_http", f"--topic={topic}", f"--nsqd-tcp-address={addr(shared_nsqd)}", "--channel=p",
                  f"--post={posts.url}/in", "--header=X-Test=yes", "--content-type=text/plain",
                  "--consumer-opt=backoff_multiplier,0.05", "--consumer-opt=default_requeue_delay,0.05"),
             Tool("nsq_to_http", f"--topic={topic}", f"--nsqd-tcp-address={addr(shared_nsqd)}", "--channel=g",
                  f"--get={gets.url}/in?msg=%s", "--status-every=1")]
    try:
        for t in tools:
            t.wait_for_line("connected to")
        with Producer([addr(shared_nsqd)]) as p:
            p.mpub(topic, [b"a b", b"c&d"])
        wait_until(lambda: len(gets.requests) == 2 and len(posts.requests) == 3, what="3 POSTs and 2 GETs")
        for t in tools:
            t.proc.send_signal(signal.SIGTERM)
            t.finish()
    finally:
        posts.close()
        gets.close()
    assert sorted(body for *_, body in posts.requests[1:]) == [b"a b", b"c&d"]   # the failed one came back
    assert all(h["X-Test"] == "yes" and h["Content-Type"] == "text/plain" for _, _, h, _ in posts.requests)
    assert sorted(path for _, path, _, _ in gets.requests) == ["/in?msg=a%20b", "/in?msg=c%26d"]
    assert any("messages" in line for line in tools[1].lines)   # the status line


def test_nsq_to_nsq_relays_and_filters_json(nsqd_factory):
    source, destination = nsqd_factory(workers=1, node_id=1), nsqd_factory(workers=1, node_id=2)
    topic = unique("relay")
    got = []
    c = Consumer(topic + "_out", "ch", lambda m: got.append(m.body), nsqd_tcp_addresses=[addr(destination)]).start()
    relay = Tool("nsq_to_nsq", f"--topic={topic}", f"--nsqd-tcp-address={addr(source)}",
                 f"--destination-nsqd-tcp-address={addr(destination)}", f"--destination-topic={topic}_out",
                 "--require-json-field=kind", "--require-json-value=keep", "--whitelist-json-field=kind",
                 "--whitelist-json-field=n")
    try:
        relay.wait_for_line("connected to")
        with Producer([addr(source)]) as p:
            p.mpub(topic, [json.dumps({"kind": "keep", "n": 1, "secret": "x"}).encode(), b"not json",
                           json.dumps({"kind": "drop", "n": 2}).encode(), json.dumps({"n": 3}).encode(),
                           json.dumps({"kind": "keep", "n": 4}).encode()])
        wait_until(lambda: len(got) == 2, what="2 relayed messages")
        relay.proc.send_signal(signal.SIGINT)
        relay.finish()
    finally:
        c.stop()
    assert sorted(json.loads(b)["n"] for b in got) == [1, 4]
    assert all(set(json.loads(b)) == {"kind", "n"} for b in got)


class FakeStats(JsonServer):
    """nsqd's /stats?format=json for one topic/channel, with figures the test sets."""

    def __init__(self, topic, channel):
        self.channel = {"channel_name": channel, "depth": 5, "backend_depth": 2, "in_flight_count": 3,
                        "deferred_count": 1, "message_count": 10, "requeue_count": 4, "timeout_count": 0,
                        "client_count": 2}
        self.topic = topic
        super().__init__(self._reply)

    def _reply(self, path):
        assert "format=json" in path
        return 200, {"version": "1.3.0", "health": "OK",
                     "topics": [{"topic_name": self.topic, "channels": [self.channel]}]}


def _stat(*args):
    out = subprocess.run([sys.executable, "-m", "nsqpy.tools.nsq_stat", *args], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()
    return out.stdout.decode().splitlines()


def test_nsq_stat_sums_nsqds_and_prints_nsqs_columns():
    a, b = FakeStats("t", "c"), FakeStats("t", "c")
    try:
        lines = _stat("--topic=t", "--channel=c", f"--nsqd-http-address={a.address}",
                      f"--nsqd-http-address={b.address}", "--interval=0.2s", "--count=2")
    finally:
        a.close()
        b.close()
    assert lines[0].startswith("------rate------+") and "ingress" in lines[1]
    rows = [line.split() for line in lines[2:]]
    assert len(rows) == 2
    assert rows[0][2:] == ["|", "10", "6", "4", "6", "2", "|", "8", "0", "20", "4"]


HTTP_LINE = re.compile(r"HTTP: listening on \[?([0-9.]+)\]?:(\d+)")


def test_nsq_stat_against_nsqds_http_api(nsqd_factory):
    node = nsqd_factory("--http-address=127.0.0.1:0", workers=1)
    m = node.wait_for_line(HTTP_LINE, 30)   # the HTTP line may follow the TCP one the factory waited for
    topic = unique("stat")
    c = Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[addr(node)], max_in_flight=0).start()
    try:
        with Producer([addr(node)]) as p:
            p.mpub(topic, [b"x"] * 7)
        lines = _stat(f"--topic={topic}", "--channel=c", f"--nsqd-http-address={m.group(1)}:{m.group(2)}",
                      "--interval=0.2s", "--count=1")
        row = lines[2].split()
        assert row[3] == "7" and row[-1] == "1", lines     # depth 7, one client
    finally:
        c.set_max_in_flight(10)
        wait_until(lambda: c.stats["finished"] == 7, what="the channel drained")
        c.stop()


class StatTool(Tool):
    """nsq_stat as a subprocess whose stdout rows are collected too."""

    def __init__(self, *args):
        super().__init__("nsq_stat", *args)
        self.rows = []
        threading.Thread(target=lambda: [self.rows.append(line.decode()) for line in self.proc.stdout],
                         daemon=True).start()

    def row_where(self, predicate, what):
        start = len(self.rows)
        wait_until(lambda: any(predicate(r) for r in self.rows[start:]), what=what, timeout=120)
        return next(r for r in self.rows[start:] if predicate(r))


def test_nsq_stat_through_lookupd_says_which_nsqds_are_left_out(nsqd_factory):
    proc, tcp, lookupd_http = _start_nsqlookupd()
    topic = unique("statnodes")
    stat = None
    try:
        nodes = [nsqd_factory(f"--lookupd-tcp-address={tcp}", "--broadcast-address=127.0.0.1",
                              "--http-address=127.0.0.1:0", workers=1, node_id=i + 1) for i in range(2)]
        for n, count in zip(nodes, (3, 4)):
            Consumer(topic, "c", lambda m: None, nsqd_tcp_addresses=[addr(n)], max_in_flight=0).start().stop()
            with Producer([addr(n)]) as p:
                p.mpub(topic, [b"x"] * count)
        stopped = "127.0.0.1:%d" % nodes[1].http_address[1]
        stat = StatTool(f"--topic={topic}", "--channel=c", f"--lookupd-http-address={lookupd_http}",
                        "--interval=0.5s", "--http-client-connect-timeout=1s", "--http-client-request-timeout=1s")
        stat.row_where(lambda r: r.split()[3:4] == ["7"], "a row with both nsqds (depth 3 + 4)")
        os.killpg(nodes[1].proc.pid, signal.SIGSTOP)     # still listed by lookupd, no longer answering
        try:
            row = stat.row_where(lambda r: "missing" in r, "a row with the stopped nsqd missing")
            assert row.split()[3] == "3" and row.rstrip().endswith("(1 of 2 nsqd missing)"), row
            stat.wait_for_line(f"nsq_stat: nsqd {stopped} did not answer (timed out); its figures are left out")
        finally:
            os.killpg(nodes[1].proc.pid, signal.SIGCONT)
        stat.row_where(lambda r: r.split()[3:4] == ["7"] and "missing" not in r, "both nsqds again")
        assert nodes[1].stop() == 0                       # lookupd drops it: it must not vanish silently
        row = stat.row_where(lambda r: "missing" in r and r.split()[3] == "3", "a row with the gone nsqd missing")
        assert row.rstrip().endswith("(1 of 2 nsqd missing)"), row
        stat.wait_for_line(f"nsq_stat: nsqd {stopped} is no longer listed by lookupd for topic {topic}")
        stat.proc.send_signal(signal.SIGTERM)
        stat.finish()
    finally:
        if stat is not None and stat.proc.poll() is None:
            stat.proc.kill()
        proc.terminate()
        proc.wait(30)
