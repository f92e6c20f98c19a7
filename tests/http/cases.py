"""nsqd's HTTP API as a table: request -> status and body (spec 2.2 and nsqd/http.go), run twice: against the Falcon
app with ``falcon.testing`` (test_app.py) and over real HTTP against a running nsqd (test_endpoints.py).

State the table assumes: topic EXISTS with channel CHAN exists; nothing named GONE exists. Rows that succeed
publish only to topic SINK (no channel: nothing is delivered) so they change nothing the others look at.
"""
from __future__ import annotations

import json
import os
import struct

EXISTS = f"httpex{os.getpid()}"
CHAN = "chan"
GONE = f"httpgone{os.getpid()}"
SINK = f"httpsink{os.getpid()}"
MAX_MSG = 1 << 20      # nsqd's defaults (the brokers of these tests run with them)
MAX_BODY = 5 << 20


def err(code):
    return {"message": code}


def mpub_binary(*bodies, count=None):
    """/mpub?binary=true's body: [int32 count]([int32 size][bytes])*, no leading size."""
    n = len(bodies) if count is None else count
    return struct.pack(">i", n) + b"".join(struct.pack(">i", len(b)) + b for b in bodies)


# (id, method, path with query, body, status, expected body: bytes exactly, a dict as JSON, or None: not checked)
CASES = [
    ("ping", "GET", "/ping", b"", 200, b"OK"),
    ("no-route", "GET", "/nope", b"", 404, err("NOT_FOUND")),
    ("pprof-404", "GET", "/debug/pprof/", b"", 404, err("NOT_FOUND")),
    ("ping-post", "POST", "/ping", b"", 405, err("METHOD_NOT_ALLOWED")),
    ("pub-get", "GET", f"/pub?topic={SINK}", b"", 405, err("METHOD_NOT_ALLOWED")),
    ("stats-post", "POST", "/stats", b"", 405, err("METHOD_NOT_ALLOWED")),
    # any method a route does not serve, one Falcon does not know too, is NSQ's 405 (Go's JSON bytes: no spaces)
    ("foo-ping", "FOO", "/ping", b"", 405, b'{"message":"METHOD_NOT_ALLOWED"}'),
    ("foo-pub", "FOO", f"/pub?topic={SINK}", b"x", 405, b'{"message":"METHOD_NOT_ALLOWED"}'),
    ("foo-config", "FOO", "/config/log_level", b"", 405, b'{"message":"METHOD_NOT_ALLOWED"}'),
    ("foo-no-route", "FOO", "/nope", b"", 404, b'{"message":"NOT_FOUND"}'),
    # /pub: body size first, then emptiness, then the topic, then defer
    ("pub-ok", "POST", f"/pub?topic={SINK}", b"hello", 200, b"OK"),
    ("pub-binary-body", "POST", f"/pub?topic={SINK}", b"\xff\x00\xfe", 200, b"OK"),
    ("pub-too-big-no-topic", "POST", "/pub", b"x" * (MAX_MSG + 1), 413, err("MSG_TOO_BIG")),
    ("pub-max-size", "POST", f"/pub?topic={SINK}", b"x" * MAX_MSG, 200, b"OK"),
    ("pub-empty", "POST", f"/pub?topic={SINK}", b"", 400, err("MSG_EMPTY")),
    ("pub-no-topic", "POST", "/pub", b"x", 400, err("MISSING_ARG_TOPIC")),
    ("pub-bad-topic", "POST", "/pub?topic=no!pe", b"x", 400, err("INVALID_TOPIC")),
    ("pub-long-topic", "POST", "/pub?topic=" + "a" * 65, b"x", 400, err("INVALID_TOPIC")),
    ("pub-non-utf8-topic", "POST", "/pub?topic=%FF%FE", b"x", 400, err("INVALID_TOPIC")),
    ("pub-bad-escape", "POST", "/pub?topic=%ZZ", b"x", 400, err("INVALID_REQUEST")),
    ("pub-semicolon", "POST", f"/pub?topic={SINK};x=1", b"x", 400, err("INVALID_REQUEST")),
    ("pub-form-body-ignored", "POST", "/pub", b"topic=abc", 400, err("MISSING_ARG_TOPIC")),
    ("pub-defer-nan", "POST", f"/pub?topic={SINK}&defer=soon", b"x", 400, err("INVALID_DEFER")),
    ("pub-defer-negative", "POST", f"/pub?topic={SINK}&defer=-1", b"x", 400, err("INVALID_DEFER")),
    ("pub-defer-too-long", "POST", f"/pub?topic={SINK}&defer=3600001", b"x", 400, err("INVALID_DEFER")),
    ("pub-defer-max", "POST", f"/pub?topic={SINK}&defer=3600000", b"x", 200, b"OK"),
    # /mpub
    ("mpub-text", "POST", f"/mpub?topic={SINK}", b"a\nb\n\nc\r\n", 200, b"OK"),
    ("mpub-empty", "POST", f"/mpub?topic={SINK}", b"", 200, b"OK"),
    ("mpub-binary", "POST", f"/mpub?topic={SINK}&binary=true", mpub_binary(b"a\nb", b"c"), 200, b"OK"),
    ("mpub-binary-any-value", "POST", f"/mpub?topic={SINK}&binary=yes", mpub_binary(b"z"), 200, b"OK"),
    ("mpub-body-too-big", "POST", f"/mpub?topic={SINK}", b"x\n" * (MAX_BODY // 2 + 1), 413, err("BODY_TOO_BIG")),
    ("mpub-no-topic", "POST", "/mpub", b"x", 400, err("MISSING_ARG_TOPIC")),
    ("mpub-bad-topic", "POST", "/mpub?topic=a*b", b"x", 400, err("INVALID_TOPIC")),
    ("mpub-line-too-big", "POST", f"/mpub?topic={SINK}", b"a\n" + b"x" * (MAX_MSG + 1), 413, err("MSG_TOO_BIG")),
    ("mpub-binary-short", "POST", f"/mpub?topic={SINK}&binary=1", b"\0\0", 413, err("BAD_BODY")),
    ("mpub-binary-zero", "POST", f"/mpub?topic={SINK}&binary=1", mpub_binary(), 413, err("BAD_BODY")),
    ("mpub-binary-empty-msg", "POST", f"/mpub?topic={SINK}&binary=1", mpub_binary(b""), 413, err("BAD_MESSAGE")),
    ("mpub-binary-missing", "POST", f"/mpub?topic={SINK}&binary=1", mpub_binary(b"a", count=2), 413,
     err("BAD_MESSAGE")),
    ("mpub-binary-msg-too-big", "POST", f"/mpub?topic={SINK}&binary=1", mpub_binary(b"x" * (MAX_MSG + 1)), 413,
     err("BAD_MESSAGE")),
    # topics
    ("topic-create", "POST", f"/topic/create?topic={EXISTS}", b"", 200, b""),
    ("topic-create-missing", "POST", "/topic/create", b"", 400, err("MISSING_ARG_TOPIC")),
    ("topic-create-bad", "POST", "/topic/create?topic=a%20b", b"", 400, err("INVALID_TOPIC")),
    ("topic-delete-missing", "POST", "/topic/delete", b"", 400, err("MISSING_ARG_TOPIC")),
    ("topic-delete-gone", "POST", f"/topic/delete?topic={GONE}", b"", 404, err("TOPIC_NOT_FOUND")),
    ("topic-delete-bad", "POST", "/topic/delete?topic=a%20b", b"", 404, err("TOPIC_NOT_FOUND")),
    ("topic-empty-missing", "POST", "/topic/empty", b"", 400, err("MISSING_ARG_TOPIC")),
    ("topic-empty-bad", "POST", "/topic/empty?topic=a%20b", b"", 400, err("INVALID_TOPIC")),
    ("topic-empty-gone", "POST", f"/topic/empty?topic={GONE}", b"", 404, err("TOPIC_NOT_FOUND")),
    ("topic-pause-missing", "POST", "/topic/pause", b"", 400, err("MISSING_ARG_TOPIC")),
    ("topic-pause-gone", "POST", f"/topic/pause?topic={GONE}", b"", 404, err("TOPIC_NOT_FOUND")),
    ("topic-unpause-gone", "POST", f"/topic/unpause?topic={GONE}", b"", 404, err("TOPIC_NOT_FOUND")),
    ("topic-unpause", "POST", f"/topic/unpause?topic={EXISTS}", b"", 200, b""),
    ("topic-bad-query", "POST", "/topic/create?topic=%", b"", 400, err("INVALID_REQUEST")),
    # channels
    ("channel-create", "POST", f"/channel/create?topic={EXISTS}&channel={CHAN}", b"", 200, b""),
    ("channel-create-no-topic", "POST", f"/channel/create?channel={CHAN}", b"", 400, err("MISSING_ARG_TOPIC")),
    ("channel-create-bad-topic", "POST", f"/channel/create?topic=a!&channel={CHAN}", b"", 400,
     err("INVALID_ARG_TOPIC")),
    ("channel-create-no-channel", "POST", f"/channel/create?topic={EXISTS}", b"", 400, err("MISSING_ARG_CHANNEL")),
    ("channel-create-bad-channel", "POST", f"/channel/create?topic={EXISTS}&channel=c%00", b"", 400,
     err("INVALID_ARG_CHANNEL")),
    ("channel-create-topic-gone", "POST", f"/channel/create?topic={GONE}&channel={CHAN}", b"", 404,
     err("TOPIC_NOT_FOUND")),
    ("channel-unpause", "POST", f"/channel/unpause?topic={EXISTS}&channel={CHAN}", b"", 200, b""),
    ("channel-empty", "POST", f"/channel/empty?topic={EXISTS}&channel={CHAN}", b"", 200, b""),
] + [
    (f"channel-{op}-{what}", "POST", f"/channel/{op}?topic={topic}&channel=nochan", b"", 404, err(code))
    for op in ("delete", "empty", "pause", "unpause")
    for what, topic, code in (("gone-channel", EXISTS, "CHANNEL_NOT_FOUND"), ("gone-topic", GONE, "TOPIC_NOT_FOUND"))
] + [
    # config
    ("config-get", "GET", "/config/max_msg_size", b"", 200, MAX_MSG),
    ("config-get-duration", "GET", "/config/msg_timeout", b"", 200, 60 * 10**9),
    ("config-get-log-level", "GET", "/config/log_level", b"", 200, None),
    ("config-get-unknown", "GET", "/config/nope", b"", 400, err("INVALID_OPTION")),
    ("config-put-other", "PUT", "/config/max_msg_size", b"1", 400, err("INVALID_OPTION")),
    ("config-put-empty", "PUT", "/config/log_level", b"", 413, err("INVALID_VALUE")),
    ("config-put-too-big", "PUT", "/config/log_level", b"x" * (MAX_MSG + 1), 413, err("INVALID_VALUE")),
    ("config-put-bad-level", "PUT", "/config/log_level", b"loud", 400, err("INVALID_VALUE")),
    ("config-put-bad-lookupd", "PUT", "/config/nsqlookupd_tcp_addresses", b"[1,", 400, err("INVALID_VALUE")),
    ("config-post", "POST", "/config/log_level", b"info", 405, err("METHOD_NOT_ALLOWED")),
    # stats filters
    ("stats-unknown-topic", "GET", f"/stats?format=json&topic={GONE}", b"", 200, None),
    ("stats-bad-query", "GET", "/stats?format=json&topic=%G0", b"", 400, err("INVALID_REQUEST")),
]

# Applied in this order before the table runs (and so the state it assumes)
SETUP = [("POST", f"/topic/create?topic={EXISTS}"), ("POST", f"/channel/create?topic={EXISTS}&channel={CHAN}")]


def check(case, status, body: bytes, headers: dict):
    """Assert one reply matches its row; headers are lower-cased names."""
    ident, method, path, _, want_status, want = case
    assert status == want_status, (ident, status, body[:200])
    assert headers.get("x-nsq-content-type") == "nsq; version=1.0", (ident, headers)
    if want is None:
        return
    if isinstance(want, bytes):
        assert body == want, (ident, body[:200])
    else:
        assert headers.get("content-type", "").startswith("application/json"), (ident, headers)
        assert json.loads(body) == want, (ident, body[:200])
