"""End-to-end processing latency against a real nsqd (--e2e-processing-latency-percentile, workers/domain/e2e.py): a
consumer holds every message at least HOLD before its FIN, and /stats (JSON and text), /metrics and statsd then show
per channel and per topic a count and percentiles no smaller than that, in nsqd's shape; once the window has passed
without FINs they are gone again. Without the flag /stats keeps nsqd's ``{"count": 0, "percentiles": null}``."""
from __future__ import annotations

import json
import re
import socket
import time

from nsqpy.protocol import client as C
from tests.broker.wire import consumer, producer, unique
from tests.http.conftest import request
from tests.polling import wait_until

HOLD = 0.06          # seconds each message is held before its FIN (the lower bound every percentile must meet)
N = 20
WINDOW = "20s"       # what /stats shows covers the last 10 to 20 s: long enough to read it all on a slow machine
QUANTILES = [1, 0.99, 0.5]
NONE = {"count": 0, "percentiles": None}


def _stats(api, topic):
    def get():
        status, _, body = request(api, "GET", f"/stats?format=json&topic={topic}")
        assert status == 200
        return json.loads(body)["topics"]
    [t] = wait_until(get, what=f"topic {topic} in /stats")  # (a publish forwarded to its owner may come late)
    return t


def _consume_and_fin(c, hold):
    """Take the N messages of a subscribed consumer, hold them, FIN the first alone and the rest in one write (the
    batch path), then a sync point (the FINs were processed)."""
    c.send(C.rdy(N))
    msgs = c.read_messages(N)
    got = time.monotonic()
    if hold:
        time.sleep(hold)  # the latency being measured, not a synchronisation
    assert time.monotonic() - got >= hold
    c.send(C.fin(msgs[0].id))
    c.send(b"".join(C.fin(m.id) for m in msgs[1:]))
    c.sync()


def _samples(text):
    """Prometheus text -> {(name, sorted label pairs): value}."""
    out = {}
    for m in re.finditer(r'^(\w+)\{(.*)\} (\S+)$', text, re.M):
        labels = tuple(sorted(re.findall(r'(\w+)="([^"]*)"', m.group(2))))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def _check_percentiles(e2e, count, at_least):
    assert e2e["count"] == count
    assert [list(p) for p in e2e["percentiles"]] == [["quantile", "value"]] * len(QUANTILES)  # nsqd's keys
    assert [p["quantile"] for p in e2e["percentiles"]] == QUANTILES
    values = [p["value"] for p in e2e["percentiles"]]
    assert all(isinstance(v, int) for v in values)
    assert values == sorted(values, reverse=True)
    assert values[0] >= at_least * 1e9
    return values


def test_e2e_percentiles_in_stats_metrics_and_statsd(nsqd_factory):
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(60)
    with udp:
        nsqd = nsqd_factory("--e2e-processing-latency-percentile=1.0,0.99", "--e2e-processing-latency-percentile=0.5",
                            f"--e2e-processing-latency-window-time={WINDOW}", "--statsd-interval=1s",
                            f"--statsd-address=127.0.0.1:{udp.getsockname()[1]}", "--statsd-prefix=")
        api = nsqd.http_address
        lonely = unique("e2e")
        producer(nsqd.address, lonely, b"x")
        assert _stats(api, lonely)["e2e_processing_latency"] == NONE   # a topic without channels, as nsqd
        topic = unique("e2e")
        idle, held, quick = (consumer(nsqd.address, topic, name, rdy=0) for name in ("idle", "held", "quick"))
        producer(nsqd.address, topic, *[b"m%d" % i for i in range(N)])
        _consume_and_fin(held, HOLD)
        _consume_and_fin(quick, 0)

        t = _stats(api, topic)
        chans = {c["channel_name"]: c for c in t["channels"]}
        # a channel with the flag and no FIN: nsqd's empty stream answers 0 for every percentile
        assert chans["idle"]["e2e_processing_latency"] == {
            "count": 0, "percentiles": [{"quantile": q, "value": 0} for q in QUANTILES]}
        values = _check_percentiles(chans["held"]["e2e_processing_latency"], N, HOLD)
        assert values[-1] >= HOLD * 1e9                                   # every FIN came after the hold
        quick_values = _check_percentiles(chans["quick"]["e2e_processing_latency"], N, 0)
        top = _check_percentiles(t["e2e_processing_latency"], 2 * N, HOLD)   # the channels merged
        assert top[0] == max(values[0], quick_values[0])

        # text: nsqd's printStats, e.g. "e2e%: 61.2ms, 61.0ms, 60.5ms"
        status, _, body = request(api, "GET", f"/stats?topic={topic}")
        text = body.decode()
        line = next(x for x in text.splitlines() if "[held " in x)
        shown = re.search(r"e2e%: (.*)$", line).group(1).split(", ")
        assert len(shown) == 3 and all(re.fullmatch(r"\d+\.\d(ms|s)", s) for s in shown), line
        line = next(x for x in text.splitlines() if f"[{topic}" in x)
        assert re.search(r"e2e%: \d+\.\d(ms|s), \d+\.\d(us|ms|s), \d+\.\d(ns|us|ms|s)$", line), line

        # Prometheus: a gauge per quantile, in seconds
        status, _, body = request(api, "GET", "/metrics")
        metrics = _samples(body.decode())
        for q in ("1.0", "0.99", "0.5"):
            assert metrics[("nsq_channel_e2e_processing_latency_seconds",
                            (("channel", "held"), ("quantile", q), ("topic", topic)))] >= HOLD
            assert metrics[("nsq_topic_e2e_processing_latency_seconds", (("quantile", q), ("topic", topic)))] > 0
        assert metrics[("nsq_channel_e2e_processing_latency_count", (("channel", "held"), ("topic", topic)))] == N

        # statsd: nsqd's gauge names, e2e_processing_latency_<percentile x 100>, in ns
        lines = {}
        want = [f"topic.{topic}.channel.held.e2e_processing_latency_{p}" for p in (100, 99, 50)] + \
               [f"topic.{topic}.e2e_processing_latency_{p}" for p in (100, 99, 50)]

        def pushed():
            data, _ = udp.recvfrom(65536)
            for x in data.decode().splitlines():
                name, _, value = x.partition(":")
                lines[name] = value
            return all(lines.get(k, "0|g") != "0|g" for k in want)

        wait_until(pushed, what="statsd's e2e gauges")
        for k in want:
            assert lines[k].endswith("|g") and int(lines[k][:-2]) >= (HOLD * 1e9 if "held" in k or k.endswith(
                "_100") else 0), (k, lines[k])

        # the window moves on: without FINs the latencies are gone once it has passed
        wait_until(lambda: _stats(api, topic)["e2e_processing_latency"]["count"] == 0, what="the window passing")
        t = _stats(api, topic)
        assert {c["channel_name"]: c["e2e_processing_latency"]["count"] for c in t["channels"]} == \
            {"idle": 0, "held": 0, "quick": 0}
        for c in (idle, held, quick):
            c.close()


def test_without_the_flag_stats_keep_nsqds_empty_e2e(nsqd_factory):
    nsqd = nsqd_factory()
    api = nsqd.http_address
    topic = unique("e2e")
    c = consumer(nsqd.address, topic, "ch", rdy=0)
    producer(nsqd.address, topic, *[b"m%d" % i for i in range(N)])
    _consume_and_fin(c, 0)
    wait_until(lambda: _stats(api, topic)["channels"][0]["in_flight_count"] == 0, what="the FINs")
    t = _stats(api, topic)
    assert t["e2e_processing_latency"] == NONE
    assert t["channels"][0]["e2e_processing_latency"] == NONE
    _, _, body = request(api, "GET", f"/stats?topic={topic}")
    assert re.search(r"msgs: 20\s+e2e%: \n", body.decode())
    _, _, body = request(api, "GET", "/metrics")
    assert not [k for k in _samples(body.decode()) if "e2e" in k[0]]
    c.close()


def test_text_shows_percentiles_as_nsqd():
    """nsqd's printStats shows each value with stringy.NanoSecondToHuman: one decimal, the largest unit exceeded."""
    from nsqpy.http_api.stats_text import _e2e, nanoseconds_to_human
    assert [nanoseconds_to_human(v) for v in (0, 999, 1000, 1001, 1_500_000, 61_234_567, 1_000_000_000,
                                              2_345_678_901)] == \
        ["0.0ns", "999.0ns", "1000.0ns", "1.0us", "1.5ms", "61.2ms", "1000.0ms", "2.3s"]
    assert _e2e(NONE) == ""
    assert _e2e({"count": 3, "percentiles": [{"quantile": 1, "value": 61_234_567},
                                              {"quantile": 0.5, "value": 1_500}]}) == "61.2ms, 1.5us"
