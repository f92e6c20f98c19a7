"""The utilities' bad cases as real subprocesses: each ends with one line on stderr saying what is wrong and what
to do, and exit status 1 (no traceback, nothing lost); every tool prints its version; a failed POST is one log
line and the message is retried; SIGTERM stops nsq_to_nsq at once while its destination is down."""

import importlib.metadata
import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from nsqpy.client import Consumer, Producer
from tests.client.helpers import addr, unique, wait_until
from tests.tools.test_tools_pipeline import Tool
from tests.tools.test_tools_relay import Receiver

DEAD = "127.0.0.1:1"      # nothing listens on port 1
TOOLS = ["to_nsq", "nsq_tail", "nsq_stat", "nsq_to_file", "nsq_to_http", "nsq_to_nsq"]


def run(name, *args, stdin=b""):
    return subprocess.run([sys.executable, "-m", f"nsqpy.tools.{name}", *args], input=stdin, capture_output=True,
                          timeout=120)


def one_line(out) -> str:
    err = out.stderr.decode()
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


BAD_CASES = [
    ("to_nsq", ["--topic=t", f"--nsqd-tcp-address={DEAD}"], b"hi\n",
     [f"{DEAD}: connection refused", "start nsqd there or fix --nsqd-tcp-address"]),
    ("to_nsq", ["--topic=bad topic!", f"--nsqd-tcp-address={DEAD}"], b"hi\n",
     ["invalid topic name 'bad topic!'", "[.a-zA-Z0-9_-]"]),
    ("nsq_tail", ["--topic=t", f"--nsqd-tcp-address={DEAD}"], b"",       # go-nsq's ConnectToNSQDs fails too
     [f"{DEAD}: connection refused", "start nsqd there or fix --nsqd-tcp-address"]),
    ("nsq_to_file", ["--topic=t", f"--nsqd-tcp-address={DEAD}"], b"", [f"{DEAD}: connection refused"]),
    ("nsq_to_http", ["--topic=t", f"--nsqd-tcp-address={DEAD}", "--post=http://x/"], b"",
     [f"{DEAD}: connection refused"]),
    ("nsq_to_file", ["--topic=t", "--channel=#ephemeral", f"--nsqd-tcp-address={DEAD}"], b"",
     ["invalid channel name '#ephemeral'"]),
    ("nsq_tail", ["--topic=bad topic!", f"--nsqd-tcp-address={DEAD}"], b"",
     ["invalid topic name 'bad topic!'", "1-64 characters"]),
    ("nsq_tail", ["--topic=t", "--channel=a/b", f"--nsqd-tcp-address={DEAD}"], b"",
     ["invalid channel name 'a/b'"]),
    ("nsq_to_nsq", ["--topic=t", f"--nsqd-tcp-address={DEAD}", f"--destination-nsqd-tcp-address={DEAD}"], b"",
     [f"destination: no nsqd reachable: {DEAD}: connection refused", "--destination-nsqd-tcp-address"]),
    ("nsq_to_nsq", ["--topic=t", f"--nsqd-tcp-address={DEAD}", f"--destination-nsqd-tcp-address={DEAD}",
                    "--destination-topic=" + "y" * 70], b"", ["invalid topic name"]),
    ("nsq_to_http", ["--topic=t", "--channel=no good", f"--nsqd-tcp-address={DEAD}", "--post=http://x/"], b"",
     ["invalid channel name 'no good'"]),
]


@pytest.mark.parametrize("name,args,stdin,expected", BAD_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(BAD_CASES)])
def test_bad_case_is_one_line_and_exit_1(name, args, stdin, expected):
    started = time.monotonic()
    out = run(name, *args, stdin=stdin)
    line = one_line(out)
    assert out.returncode == 1, line
    assert line.startswith(f"{name}: ")
    for text in expected:
        assert text in line, line
    assert time.monotonic() - started < 60    # it used to wait out connect_timeout (10 s) in silence


@pytest.mark.parametrize("name", TOOLS)
def test_every_tool_prints_its_version(name):
    for flag in ("--version", "-version"):     # NSQ's tools are Go programs: one dash is as common
        out = run(name, flag)
        assert out.returncode == 0, out.stderr.decode()
        # the installed distribution's version (setup.cfg reads nsqpy.client.config.VERSION: one place)
        assert out.stdout.decode() == f"{name} v{importlib.metadata.version('nsqpy')} (nsqpy)\n"


def test_to_nsq_stops_at_a_record_nsqd_refuses_and_keeps_the_others(shared_nsqd):
    topic = unique("toobig")
    got = []
    c = Consumer(topic, "c", lambda m: got.append(m.body), nsqd_tcp_addresses=[addr(shared_nsqd)]).start()
    try:
        out = run("to_nsq", f"--topic={topic}", f"--nsqd-tcp-address={addr(shared_nsqd)}",
                  stdin=b"first\n" + b"x" * (2 << 20) + b"\nlast\n")
        line = one_line(out)
        assert out.returncode == 1, line
        assert line.startswith(f"to_nsq: record 2 not published to {addr(shared_nsqd)}: E_BAD_MESSAGE"), line
        assert "raise nsqd's --max-msg-size" in line and "stopped reading after record 3" in line, line
        wait_until(lambda: sorted(got) == [b"first", b"last"], what="the records around the refused one")
        with Producer([addr(shared_nsqd)]) as p:      # a sync point: nothing else arrives
            p.publish(topic, b"sync")
        wait_until(lambda: b"sync" in got, what="the sync message")
        assert sorted(got) == [b"first", b"last", b"sync"]
    finally:
        c.stop()


def test_nsq_to_http_failed_post_is_one_line_and_the_message_is_retried(shared_nsqd):
    topic = unique("flaky")
    target = Receiver(fail_first=1)
    relay = Tool("nsq_to_http", f"--topic={topic}", f"--nsqd-tcp-address={addr(shared_nsqd)}",
                 f"--post={target.url}", "--consumer-opt=default_requeue_delay,0.1s",
                 "--consumer-opt=backoff_multiplier,0.1s")
    try:
        relay.wait_for_line("connected to")
        with Producer([addr(shared_nsqd)]) as p:
            p.publish(topic, b"payload")
        wait_until(lambda: len(target.requests) == 2, what="the POST, then its retry")
        assert [body for *_, body in target.requests] == [b"payload", b"payload"]
        relay.proc.send_signal(signal.SIGTERM)
        relay.finish()
    finally:
        if relay.proc.poll() is None:
            relay.proc.kill()
        target.close()
    text = "".join(relay.lines)
    assert "Traceback" not in text, text
    failed = [line for line in relay.lines if "POST" in line]
    assert len(failed) == 1 and f"POST {target.url}: HTTP 500; message " in failed[0], text
    assert "requeued (attempt 1)" in failed[0]


def _channel(node, topic, channel):
    host, port = node.http_address
    url = f"http://{host}:{port}/stats?format=json&topic={topic}&channel={channel}"
    with urllib.request.urlopen(url, timeout=30) as response:
        stats = json.loads(response.read())
    for t in stats["topics"]:
        for c in t["channels"]:
            if t["topic_name"] == topic and c["channel_name"] == channel:
                return c
    return {}


def test_nsq_to_nsq_stops_promptly_on_sigterm_while_its_destination_is_down(nsqd_factory):
    source = nsqd_factory("--http-address=127.0.0.1:0", workers=1, node_id=1)
    destination = nsqd_factory(workers=1, node_id=2)
    topic = unique("relaydown")
    relay = Tool("nsq_to_nsq", f"--topic={topic}", f"--nsqd-tcp-address={addr(source)}",
                 f"--destination-nsqd-tcp-address={addr(destination)}")
    try:
        relay.wait_for_line("connected to")
        assert destination.stop() == 0
        with Producer([addr(source)]) as p:
            p.publish(topic, b"held")
        wait_until(lambda: _channel(source, topic, "nsq_to_nsq").get("in_flight_count") == 1,
                   what="the message in the relay's handler")
        started = time.monotonic()
        relay.proc.send_signal(signal.SIGTERM)
        relay.finish()
        took = time.monotonic() - started
    finally:
        if relay.proc.poll() is None:
            relay.proc.kill()
    assert "Traceback" not in "".join(relay.lines), "".join(relay.lines)
    # the handler's publish was dialling the dead destination (for up to connect_timeout, 10 s): stopping the
    # producers first ends it at once, and the message goes back to the source
    assert took < 8, took
    print(f"nsq_to_nsq SIGTERM to exit with a handler dialling a dead destination: {took:.2f}s")
    wait_until(lambda: _channel(source, topic, "nsq_to_nsq").get("depth", 0)
               + _channel(source, topic, "nsq_to_nsq").get("deferred_count", 0) == 1,
               what="the message requeued on the source")


def test_nsq_tail_whose_stdout_goes_away_requeues_and_says_so(shared_nsqd):
    topic = unique("tailpipe")
    tail = Tool("nsq_tail", f"--topic={topic}", "--channel=tail", f"--nsqd-tcp-address={addr(shared_nsqd)}")
    try:
        tail.wait_for_line("connected to")
        with Producer([addr(shared_nsqd)]) as p:
            p.publish(topic, b"one")
            assert tail.proc.stdout.readline() == b"one\n"
            tail.proc.stdout.close()               # `nsq_tail | head -1`: the reader is gone
            p.publish(topic, b"two")
        assert tail.proc.wait(120) == 1
        tail._reader.join(30)
    finally:
        if tail.proc.poll() is None:
            tail.proc.kill()
    text = "".join(tail.lines)
    assert "Traceback" not in text and "Exception ignored" not in text, text
    assert tail.lines[-1] == "nsq_tail: cannot write to stdout (broken pipe); the message is requeued\n", text
    got = []
    c = Consumer(topic, "tail", lambda m: got.append(m.body), nsqd_tcp_addresses=[addr(shared_nsqd)]).start()
    try:
        wait_until(lambda: got == [b"two"], what="the message nsq_tail could not print")
    finally:
        c.stop()
