"""The policy fields of a /stats dict on the surfaces built from it (pure functions, no broker): statsd's counters
(deltas between pushes), the text /stats line, /metrics; a channel without them adds nothing anywhere."""
from __future__ import annotations

from nsqpy.http_api.metrics import exposition
from nsqpy.http_api.stats_text import policy_line, stats_text
from nsqpy.http_api.statsd import statsd_lines

E2E = {"count": 0, "percentiles": None}
POLICY = {"max_attempts": 3, "dead_letter_topic": "t.dead", "message_ttl_ms": 2500, "max_depth": 0,
          "max_bytes": 1000, "overflow": "reject"}


def channel(name, **extra):
    return {"channel_name": name, "depth": 0, "backend_depth": 0, "in_flight_count": 0, "deferred_count": 0,
            "message_count": 0, "requeue_count": 0, "timeout_count": 0, "client_count": 0, "clients": [],
            "paused": False, "e2e_processing_latency": E2E, **extra}


def stats(*channels):
    return {"version": "1.3.0", "health": "OK", "start_time": 0, "producers": None,
            "topics": [{"topic_name": "t", "channels": list(channels), "depth": 0, "backend_depth": 0,
                        "message_count": 0, "message_bytes": 0, "paused": False, "e2e_processing_latency": E2E}]}


def counted(dead, expired, dropped, policy=POLICY):
    extra = {"dead_lettered_count": dead, "expired_count": expired, "dropped_count": dropped}
    if policy:
        extra["policy"] = policy
    return extra


def test_statsd_counts_deltas_only_for_channels_with_policies():
    first = stats(channel("p", **counted(2, 1, 0)), channel("plain"))
    lines = statsd_lines(first, None, "nsq.", mem=False)
    assert "nsq.topic.t.channel.p.dead_lettered_count:2|c" in lines
    assert "nsq.topic.t.channel.p.expired_count:1|c" in lines
    assert "nsq.topic.t.channel.p.dropped_count:0|c" in lines
    assert not [ln for ln in lines if ".plain." in ln and ("dead_lettered" in ln or "dropped" in ln)]
    second = stats(channel("p", **counted(5, 1, 4)), channel("plain"))
    lines = statsd_lines(second, first, "nsq.", mem=False)
    assert "nsq.topic.t.channel.p.dead_lettered_count:3|c" in lines
    assert "nsq.topic.t.channel.p.dropped_count:4|c" in lines


def test_text_line():
    assert policy_line(channel("p", **counted(1, 2, 3))).split() == [
        "policy:", "dead-lettered:", "1", "expired:", "2", "dropped:", "3", "max-attempts=3", "dead-letter=t.dead",
        "ttl=2.5s", "max-bytes=1000", "overflow=reject"]
    # a policy turned off after it counted: the counters, marked off
    assert policy_line(channel("p", **counted(1, 0, 0, policy=None))).endswith("(off)")
    text = stats_text(stats(channel("p", **counted(0, 0, 0)), channel("plain")), "nsqd v1.3.0", now=0)
    assert text.count("policy:") == 1
    assert "policy:" not in stats_text(stats(channel("plain")), "nsqd v1.3.0", now=0)


def test_metrics():
    m = exposition(stats(channel("p", **counted(1, 2, 3)), channel("plain")), {}).decode()
    for line in ('nsqpy_channel_dead_lettered_total{channel="p",topic="t"} 1.0',
                 'nsqpy_channel_expired_total{channel="p",topic="t"} 2.0',
                 'nsqpy_channel_dropped_total{channel="p",topic="t"} 3.0',
                 'nsqpy_channel_policy_max_attempts{channel="p",topic="t"} 3.0',
                 'nsqpy_channel_policy_message_ttl_seconds{channel="p",topic="t"} 2.5',
                 'nsqpy_channel_policy_max_bytes{channel="p",topic="t"} 1000.0',
                 'nsqpy_channel_policy_info{channel="p",dead_letter_topic="t.dead",overflow="reject",topic="t"} 1.0'):
        assert line in m, line
    assert 'channel="plain"' not in "".join(ln for ln in m.splitlines() if ln.startswith("nsqpy_channel"))
