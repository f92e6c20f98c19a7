"""A topic or channel created or deleted on nsqd reaches every nsqlookupd at once, not at the next tick: nsqd runs
with its periodic paths to lookupd an hour apart (``slow_ticks.py``: the workers' stats publication and the link's
poll), so whatever lookupd shows within seconds came through the wake-up the change itself sends
(workers/domain/stats_rows.py ``structure_changed``, workers/processes/lookupd_link.py). Creation over nsqd's HTTP API and over TCP (PUB,
SUB), deletion over HTTP and by nsqd itself (an ephemeral channel's last consumer leaving).

The lags measured here (reply -> first /lookup that shows the change) are only printed: the bound asserted is the
generous deadline; ``benchmarks/lookupd_lag.py`` measures them against nsqd's real ticks."""
from __future__ import annotations

import statistics
import time

from lookupd_wire import eventually
from tests.broker.wire import consumer, producer, unique
from tests.http.conftest import request

DEADLINE = 10.0   # the ticks are an hour apart: anything within this came through the wake-up
PAUSE = 0.002


def registered(lk, topic, channel=None):
    """The nsqd is a producer of the topic (or of its channel) in lookupd's registrations (``/debug``: /lookup
    lists a non-ephemeral channel on after its UNREGISTER, as nsqlookupd does)."""
    key = f"topic:{topic}:" if channel is None else f"channel:{topic}:{channel}"
    return bool(lk.get_json("/debug").get(key))


def lag(lookupds, cond, what):
    """Seconds until ``cond(lk)`` held on every lookupd, from now (just after the reply)."""
    start = time.monotonic()
    for lk in lookupds:
        eventually(lambda: cond(lk), timeout=DEADLINE, what=what, pause=PAUSE)
    return time.monotonic() - start


def test_changes_reach_every_lookupd_without_a_tick(lookupd_factory, registered_nsqd):
    a, b = lookupd_factory(), lookupd_factory()
    n = registered_nsqd(a, b, http_port=None, module="tests.lookupd.slow_ticks")
    http = n.http_address
    for lk in (a, b):  # both links are up (IDENTIFY done) before anything is timed
        eventually(lambda: any(p["tcp_port"] == n.port for p in lk.get_json("/nodes")["producers"]),
                   what="nsqd identified", pause=PAUSE)
    lags = {"http create": [], "tcp pub": [], "tcp sub": [], "http delete": []}
    for _ in range(5):
        topic = unique("lagh")
        assert request(http, "POST", f"/topic/create?topic={topic}")[0] == 200
        lags["http create"].append(lag((a, b), lambda lk: registered(lk, topic), "topic created over HTTP"))
        assert request(http, "POST", f"/channel/create?topic={topic}&channel=c")[0] == 200
        lag((a, b), lambda lk: registered(lk, topic, "c"), "channel created over HTTP")
        assert request(http, "POST", f"/channel/delete?topic={topic}&channel=c")[0] == 200
        lag((a, b), lambda lk: not registered(lk, topic, "c") and registered(lk, topic), "channel deleted over HTTP")
        assert request(http, "POST", f"/topic/delete?topic={topic}")[0] == 200
        lags["http delete"].append(lag((a, b), lambda lk: not registered(lk, topic), "topic deleted over HTTP"))

        topic = unique("lagt")
        producer(n.address, topic, b"m")  # returns after the OK
        lags["tcp pub"].append(lag((a, b), lambda lk: registered(lk, topic), "topic created by PUB"))
        with consumer(n.address, topic, "s#ephemeral"):  # after SUB's OK
            lags["tcp sub"].append(lag((a, b), lambda lk: registered(lk, topic, "s#ephemeral"), "channel by SUB"))
        # the last consumer of an ephemeral channel left: nsqd deletes it, and lookupd is told
        lag((a, b), lambda lk: not registered(lk, topic, "s#ephemeral") and registered(lk, topic),
            "ephemeral channel deleted by nsqd")
    print({k: f"median {statistics.median(v) * 1e3:.1f} ms, max {max(v) * 1e3:.1f} ms" for k, v in lags.items()})
