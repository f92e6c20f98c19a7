"""One derivation of nsqd's limits (``NsqdOptions.limits()``) reaches every consumer identically.

Each row sets one limit flag. The same value must be what the derivation gives (and nothing else changes), what the
worker hands its parsers and IDENTIFY (one object), what the V2 parser enforces at the edge (at the limit accepted,
one past it refused), what IDENTIFY accepts and reports, and what the HTTP API enforces. Rows cover ordinary values,
0, the largest values the flags take, and durations with sub-millisecond parts (Go's ``d / time.Millisecond``:
truncated toward zero).
"""
from __future__ import annotations

import dataclasses
import json

import falcon.testing
import pytest

from nsqpy.config import NsqdOptions
from nsqpy.http_api.nsqd_app import NsqdDeps, create_app
from nsqpy.protocol import client as C
from nsqpy.protocol.commands import Dpub, Pub, Rdy, Req
from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.identify import default_client_settings, negotiate_identify
from nsqpy.protocol.limits import MS, NSQ_DEFAULTS, Limits, to_ms
from nsqpy.protocol.states import STATE_INIT, STATE_SUBSCRIBED
from nsqpy.protocol.v2_parser import V2Parser
from nsqpy.workers.processes import worker as W

INT64_MAX = (1 << 63) - 1
MAX_DURATION = "2562047h47m16.854775807s"  # Go's largest time.Duration
MAX_DURATION_MS = INT64_MAX // MS
ID = b"0123456789abcdef"

# (flag as given, Limits field, value the consumers must all see)
ROWS = [
    ("--max-msg-size=100", "max_msg_size", 100),
    ("--max-msg-size=0", "max_msg_size", 0),
    ("--max-body-size=1000", "max_body_size", 1000),
    ("--max-body-size=0", "max_body_size", 0),
    ("--max-rdy-count=10", "max_rdy_count", 10),
    ("--max-rdy-count=0", "max_rdy_count", 0),
    (f"--max-rdy-count={INT64_MAX}", "max_rdy_count", INT64_MAX),
    ("--max-req-timeout=5s", "max_req_timeout_ms", 5000),
    ("--max-req-timeout=0", "max_req_timeout_ms", 0),
    ("--max-req-timeout=5000999us", "max_req_timeout_ms", 5000),
    (f"--max-req-timeout={MAX_DURATION}", "max_req_timeout_ms", MAX_DURATION_MS),
    ("--max-msg-timeout=3s", "max_msg_timeout_ms", 3000),
    ("--max-msg-timeout=0", "max_msg_timeout_ms", 0),
    ("--max-msg-timeout=1.5009s", "max_msg_timeout_ms", 1500),
    (f"--max-msg-timeout={MAX_DURATION}", "max_msg_timeout_ms", MAX_DURATION_MS),
    ("--msg-timeout=1.5s", "msg_timeout_ms", 1500),
    ("--msg-timeout=1500us", "msg_timeout_ms", 1),
    ("--msg-timeout=0", "msg_timeout_ms", 0),
    ("--msg-timeout=-1500us", "msg_timeout_ms", -1),  # toward zero, as Go divides (a floor would say -2)
    ("--max-heartbeat-interval=5s", "max_heartbeat_interval_ms", 5000),
    ("--max-heartbeat-interval=0", "max_heartbeat_interval_ms", 0),
    ("--max-heartbeat-interval=2999999us", "max_heartbeat_interval_ms", 2999),
    (f"--max-heartbeat-interval={MAX_DURATION}", "max_heartbeat_interval_ms", MAX_DURATION_MS),
    ("--max-output-buffer-size=1000", "max_output_buffer_size", 1000),
    ("--max-output-buffer-size=0", "max_output_buffer_size", 0),
    ("--min-output-buffer-timeout=10ms", "min_output_buffer_timeout_ms", 10),
    ("--min-output-buffer-timeout=0", "min_output_buffer_timeout_ms", 0),
    ("--min-output-buffer-timeout=10500us", "min_output_buffer_timeout_ms", 10),
    ("--max-output-buffer-timeout=2s", "max_output_buffer_timeout_ms", 2000),
    ("--max-output-buffer-timeout=2000.5ms", "max_output_buffer_timeout_ms", 2000),
    (f"--max-output-buffer-timeout={MAX_DURATION}", "max_output_buffer_timeout_ms", MAX_DURATION_MS),
    ("--output-buffer-timeout=100ms", "output_buffer_timeout_ms", 100),
    ("--output-buffer-timeout=100999us", "output_buffer_timeout_ms", 100),
    ("--output-buffer-timeout=0", "output_buffer_timeout_ms", 0),
    ("--max-deflate-level=9", "max_deflate_level", 9),
    ("--max-deflate-level=1", "max_deflate_level", 1),
    ("--max-channel-consumers=2", "max_channel_consumers", 2),
]


def _parse(limits: Limits, data: bytes, state: int = STATE_INIT) -> list:
    return V2Parser(limits, expect_magic=False, state=state).feed(data)


def _refused(items: list, text: str) -> None:
    assert isinstance(items[-1], ProtocolError), items
    assert items[-1].data().decode() == text


def _identify(server, **fields):
    """IDENTIFY's reply as a dict, or the error text."""
    try:
        _, reply = negotiate_identify(json.dumps({"feature_negotiation": True, **fields}).encode(), server)
    except ProtocolError as e:
        return e.data().decode()
    return json.loads(reply)


def _http(opts: NsqdOptions):
    deps = NsqdDeps(opts=opts, stats=lambda **kw: {}, publish=lambda topic, bodies, defer_ms: None,
                    command=lambda op, topic, channel: "OK", info={})
    client = falcon.testing.TestClient(create_app(deps))
    return lambda path, body=b"": client.simulate_post(path.partition("?")[0], body=body,
                                                        query_string=path.partition("?")[2] or None).status_code


# ---- per field: what each consumer does at the limit and one past it ------------------------------------------
def _max_msg_size(v, server, http):
    if v + 1 < 1 << 31:  # a PUB's size is an int32 on the wire
        _refused(_parse(server.limits, C.pub("t", b"x" * (v + 1))), f"E_BAD_MESSAGE PUB message too big {v + 1} > {v}")
        _refused(_parse(server.limits, C.mpub("t", [b"x" * (v + 1)])),
                 f"E_BAD_MESSAGE MPUB message too big {v + 1} > {v}")
        assert http("/pub?topic=t", b"x" * (v + 1)) == 413
    if v > 0:
        assert _parse(server.limits, C.pub("t", b"x" * v)) == [Pub("t", b"x" * v)]
        assert http("/pub?topic=t", b"x" * v) == 200


def _max_body_size(v, server, http):
    _refused(_parse(server.limits, b"IDENTIFY\n" + (v + 1).to_bytes(4, "big")),
             f"E_BAD_BODY IDENTIFY body too big {v + 1} > {v}")
    _refused(_parse(server.limits, b"MPUB t\n" + (v + 1).to_bytes(4, "big")),
             f"E_BAD_BODY MPUB body too big {v + 1} > {v}")
    assert http("/mpub?topic=t", b"x" * (v + 1)) == 413


def _max_rdy_count(v, server, http):
    assert _parse(server.limits, C.rdy(v), STATE_SUBSCRIBED) == [Rdy(v)]
    if v < INT64_MAX:
        _refused(_parse(server.limits, C.rdy(v + 1), STATE_SUBSCRIBED),
                 f"E_INVALID RDY count {v + 1} out of range 0-{v}")
    assert _identify(server)["max_rdy_count"] == v


def _max_req_timeout_ms(v, server, http):
    assert _parse(server.limits, C.dpub("t", v, b"x")) == [Dpub("t", v, b"x")]
    _refused(_parse(server.limits, C.dpub("t", v + 1, b"x")), f"E_INVALID DPUB timeout {v + 1} out of range 0-{v}")
    if (v + 1) * MS <= INT64_MAX:  # beyond, Go's ms * time.Millisecond wraps (REQ's test table covers it)
        assert _parse(server.limits, C.req(ID, v + 1), STATE_SUBSCRIBED) == [Req(ID, v)]  # clamped
    assert http(f"/pub?topic=t&defer={v}", b"x") == 200
    assert http(f"/pub?topic=t&defer={v + 1}", b"x") == 400


def _max_msg_timeout_ms(v, server, http):
    assert _identify(server)["max_msg_timeout"] == v
    if v >= 1000:
        assert _identify(server, msg_timeout=v)["msg_timeout"] == v
    assert _identify(server, msg_timeout=v + 1) == f"E_BAD_BODY IDENTIFY msg timeout ({v + 1}) is invalid"


def _msg_timeout_ms(v, server, http):
    assert _identify(server)["msg_timeout"] == v
    assert default_client_settings(server).msg_timeout_ms == v  # what the in-flight deadline adds


def _max_heartbeat_interval_ms(v, server, http):
    if v >= 1000:
        assert isinstance(_identify(server, heartbeat_interval=v), dict)
    assert _identify(server, heartbeat_interval=v + 1) == f"E_BAD_BODY IDENTIFY heartbeat interval ({v + 1}) is invalid"


def _max_output_buffer_size(v, server, http):
    if v >= 64:
        assert _identify(server, output_buffer_size=v)["output_buffer_size"] == v
    assert _identify(server, output_buffer_size=v + 1) == f"E_BAD_BODY IDENTIFY output buffer size ({v + 1}) is invalid"


def _min_output_buffer_timeout_ms(v, server, http):
    if v >= 1:
        assert _identify(server, output_buffer_timeout=v)["output_buffer_timeout"] == v
    if v >= 2:
        assert _identify(server, output_buffer_timeout=v - 1) == \
            f"E_BAD_BODY IDENTIFY output buffer timeout ({v - 1}) is invalid"


def _max_output_buffer_timeout_ms(v, server, http):
    assert _identify(server, output_buffer_timeout=v)["output_buffer_timeout"] == v
    assert _identify(server, output_buffer_timeout=v + 1) == \
        f"E_BAD_BODY IDENTIFY output buffer timeout ({v + 1}) is invalid"


def _output_buffer_timeout_ms(v, server, http):
    assert _identify(server)["output_buffer_timeout"] == v
    assert default_client_settings(server).output_buffer_timeout_ms == v


def _max_deflate_level(v, server, http):
    reply = _identify(server, deflate=True, deflate_level=9)
    assert (reply["max_deflate_level"], reply["deflate_level"]) == (v, v)


def _max_channel_consumers(v, server, http):
    pass  # enforced at SUB by the broker's topic table (tests/broker/test_limits.py)


PROBES = {probe.__name__[1:]: probe for probe in (
    _max_msg_size, _max_body_size, _max_rdy_count, _max_req_timeout_ms, _max_msg_timeout_ms, _msg_timeout_ms,
    _max_heartbeat_interval_ms, _max_output_buffer_size, _min_output_buffer_timeout_ms,
    _max_output_buffer_timeout_ms, _output_buffer_timeout_ms, _max_deflate_level, _max_channel_consumers)}


@pytest.mark.parametrize("flag, field, value", ROWS, ids=[row[0] for row in ROWS])
def test_a_limit_flag_reaches_every_consumer_identically(flag, field, value):
    opts = NsqdOptions.parse([flag])
    limits = opts.limits()
    assert dataclasses.replace(NSQ_DEFAULTS, **{field: value}) == limits  # this field, and only this one
    server = W.server_settings(opts)  # what the worker gives its sessions: IDENTIFY's settings...
    assert server.limits == limits    # ...whose limits are the parsers' (Worker.limits is server.limits)
    PROBES[field](value, server, _http(opts))


def test_every_limit_flag_has_a_row_and_a_probe():
    fields = {f.name for f in dataclasses.fields(Limits)} - {"client_timeout_ms", "default_output_buffer_size"}
    assert {row[1] for row in ROWS} == fields == set(PROBES)


def test_defaults_are_nsqs_and_one_copy():
    """The flags' defaults are the Limits' defaults (NSQ's, nsqd/options.go), so the three can not drift."""
    assert NsqdOptions.parse([]).limits() == Limits() == NSQ_DEFAULTS
    assert NsqdOptions.parse([]).server_settings().limits == NSQ_DEFAULTS
    assert (NSQ_DEFAULTS.msg_timeout_ms, NSQ_DEFAULTS.max_msg_timeout_ms, NSQ_DEFAULTS.max_req_timeout_ms) == \
        (60_000, 900_000, 3_600_000)


@pytest.mark.parametrize("ns, ms", [(0, 0), (999_999, 0), (1_000_000, 1), (1_500_000, 1), (-1_500_000, -1),
                                    (-999_999, 0), (INT64_MAX, MAX_DURATION_MS), (-(1 << 63), -(INT64_MAX // MS))])
def test_to_ms_truncates_toward_zero_like_go(ns, ms):
    assert to_ms(ns) == ms
