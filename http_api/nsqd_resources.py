"""The resources of nsqd's HTTP API, one per route of spec 2.2 (nsqd/http.go's handlers, same checks in the same
order, so the same request fails with the same code).

Order matters where nsqd's does: /pub checks the body's size before the topic (413 MSG_TOO_BIG for a huge body
with no topic), /mpub the Content-Length before the topic and the messages after it. Parameters come from the
raw query string only (``nsqpy.http_api.query``: Go's parser, stricter than Falcon's), never from a form body.
"""
from __future__ import annotations

import json
import re
import struct

import falcon

from nsqpy.http_api.nsqd_errors import JSON_TYPE, ApiError, PublishRefused
from nsqpy.http_api.query import BOOL_PARAMS, BadQuery, parse_bool, parse_query
from nsqpy.protocol.names import is_valid_name

_LEVEL_NAMES = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}  # lg.ParseLogLevel, any case
_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)


def _params(req) -> dict:
    try:
        return parse_query(req.query_string)
    except BadQuery:
        raise ApiError(400, "INVALID_REQUEST") from None


def _first(params, key):
    values = params.get(key)
    return values[0] if values else None


def _json(resp, value) -> None:
    resp.content_type = JSON_TYPE
    resp.text = json.dumps(value, separators=(",", ":"))


def _read(req, limit: int) -> bytes:
    """At most ``limit`` + 1 bytes of the body (one more than allowed tells "too big" without reading it all).
    Under ASGI the body was read before (nsqpy.http_api.asgi.AsyncResource)."""
    body = getattr(req.context, "body", None)
    if body is not None:
        return body[:limit + 1]
    return req.bounded_stream.read(limit + 1)


class _Resource:
    def __init__(self, deps):
        self.deps = deps
        self.opts = deps.opts
        self.limits = deps.opts.limits()  # the one derivation the TCP side checks against too


class Ping(_Resource):
    def on_get(self, req, resp):
        reason = self.deps.health()
        if reason is not None:
            raise ApiError(500, f"NOK - {reason}", plain=True)
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = "OK"


class Info(_Resource):
    def on_get(self, req, resp):
        _json(resp, self.deps.info)


class Stats(_Resource):
    def on_get(self, req, resp):
        from nsqpy.http_api.stats_text import stats_text  # only for the text format

        p = _params(req)
        include_clients = parse_bool(p, "include_clients", True)
        include_mem = parse_bool(p, "include_mem", True)
        stats = self.deps.stats(topic=_first(p, "topic") or "", channel=_first(p, "channel") or "",
                                include_clients=include_clients, include_mem=include_mem)
        reason = self.deps.health()
        if reason is not None:
            stats = dict(stats, health=f"NOK - {reason}")  # a shallow copy: the reader's result is read-only
        if _first(p, "format") == "json":
            _json(resp, stats)
            return
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = stats_text(stats, self.deps.version_line)


def _topic_to_publish(params) -> str:
    """nsqd's getTopicFromQuery: a valid topic name (the topic is created by publishing)."""
    values = params.get("topic")
    if values is None:
        raise ApiError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(values[0]):
        raise ApiError(400, "INVALID_TOPIC")
    return values[0]


class Pub(_Resource):
    def on_post(self, req, resp):
        max_size = self.limits.max_msg_size
        if (req.content_length or 0) > max_size:
            raise ApiError(413, "MSG_TOO_BIG")
        body = _read(req, max_size)
        if len(body) > max_size:
            raise ApiError(413, "MSG_TOO_BIG")
        if not body:
            raise ApiError(400, "MSG_EMPTY")
        p = _params(req)
        topic = _topic_to_publish(p)
        defer_ms = 0
        if "defer" in p:
            raw = p["defer"][0]
            if not _INT.fullmatch(raw) or not -(1 << 63) <= int(raw) < 1 << 63:  # Go's strconv.ParseInt
                raise ApiError(400, "INVALID_DEFER")
            defer_ms = int(raw)
            if defer_ms < 0 or defer_ms > self.limits.max_req_timeout_ms:  # nsqd: ms * time.Millisecond > max
                raise ApiError(400, "INVALID_DEFER")
        _publish(self.deps, topic, [body], defer_ms)
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = "OK"


class Mpub(_Resource):
    def on_post(self, req, resp):
        max_body = self.limits.max_body_size
        if (req.content_length or 0) > max_body:
            raise ApiError(413, "BODY_TOO_BIG")
        p = _params(req)
        topic = _topic_to_publish(p)
        binary = False
        if "binary" in p:
            binary = BOOL_PARAMS.get(p["binary"][0], True)  # nsqd: an unknown value means binary
        body = _read(req, max_body)
        if len(body) > max_body:
            raise ApiError(413, "BODY_TOO_BIG")
        bodies = _split_binary(body, self.limits) if binary else _split_lines(body, self.limits.max_msg_size)
        if bodies:
            _publish(self.deps, topic, bodies, 0)
        elif self.deps.command("topic_create", topic, None) != "OK":  # nsqd creates the topic all the same
            raise ApiError(503, "EXITING")
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = "OK"


def _publish(deps, topic, bodies, defer_ms):
    try:
        deps.publish(topic, bodies, defer_ms)
    except PublishRefused as e:
        if str(e).startswith("CHANNEL_FULL"):  # a bounded channel refused it, or blocked it too long (issue 49)
            raise ApiError(503, "CHANNEL_FULL") from None
        raise ApiError(503, "EXITING") from None  # nsqd's answer to any failed PutMessage(s)


def _split_lines(body: bytes, max_msg_size: int) -> list:
    """Text /mpub: one message per line; empty lines are skipped, ``\\r`` is kept (as nsqd)."""
    out = []
    for line in body.split(b"\n"):
        if not line:
            continue
        if len(line) > max_msg_size:
            raise ApiError(413, "MSG_TOO_BIG")
        out.append(line)
    return out


def _split_binary(body: bytes, limits) -> list:
    """Binary /mpub: ``[int32 count]([int32 size][size bytes])*``, no leading body size; errors are readMPUB's
    codes without their ``E_``, all 413."""
    if len(body) < 4:
        raise ApiError(413, "BAD_BODY")
    (count,) = struct.unpack_from(">i", body, 0)
    if count <= 0 or count > (limits.max_body_size - 4) // 5:
        raise ApiError(413, "BAD_BODY")
    out, at = [], 4
    for _ in range(count):
        if at + 4 > len(body):
            raise ApiError(413, "BAD_MESSAGE")
        (size,) = struct.unpack_from(">i", body, at)
        at += 4
        if size <= 0 or size > limits.max_msg_size or at + size > len(body):
            raise ApiError(413, "BAD_MESSAGE")
        out.append(body[at:at + size])
        at += size
    return out  # like nsqd, bytes after the last message are ignored


def _status(deps, op, topic, channel):
    """Run a command; nsqd's replies for its outcome."""
    status = deps.command(op, topic, channel)
    if status == "OK":
        return
    if status in ("TOPIC_NOT_FOUND", "CHANNEL_NOT_FOUND"):
        raise ApiError(404, status)
    raise ApiError(500, "INTERNAL_ERROR")


class TopicCommand(_Resource):
    """/topic/create|delete|empty|pause|unpause. Only create and empty check the name (as nsqd: a malformed name
    cannot exist, so delete and pause answer 404 for it)."""

    def __init__(self, deps, op):
        super().__init__(deps)
        self.op = op

    def on_post(self, req, resp):
        p = _params(req)
        topic = _first(p, "topic")
        if topic is None:
            raise ApiError(400, "MISSING_ARG_TOPIC")
        if self.op in ("create", "empty") and not is_valid_name(topic):
            raise ApiError(400, "INVALID_TOPIC")
        if self.op != "create" and not is_valid_name(topic):
            raise ApiError(404, "TOPIC_NOT_FOUND")
        _status(self.deps, f"topic_{self.op}", topic, None)


def _channel_names(params, channel=True):
    """(topic, channel) of a channel route, checked in nsqd's order and with its codes; with ``channel`` False
    (topic, None) of a topic route, whose bad name is /topic/create's INVALID_TOPIC."""
    topic = _first(params, "topic")
    if topic is None:
        raise ApiError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise ApiError(400, "INVALID_ARG_TOPIC" if channel else "INVALID_TOPIC")
    if not channel:
        return topic, None
    name = _first(params, "channel")
    if name is None:
        raise ApiError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_name(name):
        raise ApiError(400, "INVALID_ARG_CHANNEL")
    return topic, name


class ChannelCommand(_Resource):
    """/channel/create|delete|empty|pause|unpause: the topic must exist already, even for create."""

    def __init__(self, deps, op):
        super().__init__(deps)
        self.op = op

    def on_post(self, req, resp):
        topic, channel = _channel_names(_params(req))
        if self.op == "create":
            # the owner's channel_create would create the topic too; nsqd wants it to exist (the stats plane
            # knows: a fresh snapshot includes every command answered before it)
            found = self.deps.stats(topic=topic, include_clients=False, include_mem=False).get("topics")
            if not found:
                raise ApiError(404, "TOPIC_NOT_FOUND")
        _status(self.deps, f"channel_{self.op}", topic, channel)


class PolicyConfig(_Resource):
    """Beyond NSQ (issue 49): ``GET|POST /topic/config?topic=T`` and ``/channel/config?topic=T&channel=C``, the
    policies of one topic or channel. POST's body is a JSON object of policy fields (``null`` removes one); the
    config is stored in the policy file and the topic's owner applies it (``policy_changed``) before the reply.
    Both answer ``deps.policies.describe``: the effective values (channel < topic < flags) and the configs set.

    A topic or channel that does not exist yet is configured all the same (stored, applied when it is made), so
    an operator can set a topic's limits before its first publish or a channel's before its first SUB instead of
    racing them. Names are checked as /channel/create checks them; a bad body is 400 with the field's code
    (INVALID_BODY, INVALID_FIELD, INVALID_VALUE) and nothing changes. A config stored whose owner did not answer
    in time is 500 INTERNAL_ERROR: it is in the file, and the owner applies it at its next start."""

    def __init__(self, deps, channel):
        super().__init__(deps)
        self.channel = channel

    def _names(self, req):
        return _channel_names(_params(req), self.channel)

    def _book(self):
        if self.deps.policies is None:
            raise ApiError(404, "NOT_FOUND")
        return self.deps.policies

    def on_get(self, req, resp):
        topic, channel = self._names(req)
        book = self._book()
        book.load()
        _json(resp, book.describe(topic, channel))

    def on_post(self, req, resp):
        topic, channel = self._names(req)
        book = self._book()
        limit = self.limits.max_msg_size
        body = _read(req, limit)
        if len(body) > limit:
            raise ApiError(413, "BODY_TOO_BIG")
        try:
            described = book.update(topic, channel, body, is_valid_name)
        except OSError as e:
            if self.deps.log is not None:
                self.deps.log.error(f"HTTP: the policy file cannot be written: {e}")
            raise ApiError(500, "INTERNAL_ERROR") from None
        except ValueError as e:  # policy.PolicyError: the body's field and what is wrong
            raise ApiError(400, getattr(e, "code", "INVALID_VALUE")) from None
        if self.deps.command("policy_changed", topic, None) != "OK":
            raise ApiError(500, "INTERNAL_ERROR")
        _json(resp, described)


class Config(_Resource):
    """GET any option by its config name; PUT nsqlookupd_tcp_addresses (a JSON array) or log_level (a name)."""

    def on_get(self, req, resp, opt):
        _json(resp, self._value(opt))

    def on_put(self, req, resp, opt):
        limit = self.limits.max_msg_size
        body = _read(req, limit)
        if len(body) > limit or not body:
            raise ApiError(413, "INVALID_VALUE")
        if opt == "nsqlookupd_tcp_addresses":
            try:
                addrs = json.loads(body)
            except ValueError:
                raise ApiError(400, "INVALID_VALUE") from None
            if addrs is None:
                addrs = []  # Go's json.Unmarshal of null into a slice leaves it nil
            if not isinstance(addrs, list) or not all(isinstance(a, str) for a in addrs):
                raise ApiError(400, "INVALID_VALUE")
            if self.deps.set_lookupd is None:
                raise ApiError(500, "INTERNAL_ERROR")
            self.deps.set_lookupd(addrs)
        elif opt == "log_level":
            level = _LEVEL_NAMES.get(body.decode("utf-8", "replace").lower())
            if level is None:
                raise ApiError(400, "INVALID_VALUE")
            self.deps.set_log_level(level)
        else:
            raise ApiError(400, "INVALID_OPTION")
        _json(resp, self._value(opt))

    def _value(self, opt):
        if opt == "nsqlookupd_tcp_addresses" and self.deps.get_lookupd is not None:
            return list(self.deps.get_lookupd())
        if opt == "log_level":
            return self.deps.get_log_level()
        try:
            return self.opts.config_value(opt)
        except KeyError:
            raise ApiError(400, "INVALID_OPTION") from None


class Metrics(_Resource):
    """Beyond NSQ: Prometheus' text exposition of the same counters (http_api/metrics.py)."""

    def on_get(self, req, resp):
        if self.deps.metrics is None:
            raise ApiError(404, "NOT_FOUND")
        from nsqpy.http_api.metrics import CONTENT_TYPE

        resp.content_type = CONTENT_TYPE
        resp.data = self.deps.metrics()
