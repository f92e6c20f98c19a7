"""nsqd's HTTP API (spec 2): a Falcon app over the broker's stats plane and control plane.

    app = create_app(NsqdDeps(...))     # gunicorn workers: workers/processes/http.py builds the deps from the Plan

Theory of operation: the app holds no broker state. Reads go through ``deps.stats`` (the stats plane's reader,
``nsqpy.broker.stats``), publishes and topic/channel commands through ``deps.publish`` / ``deps.command`` (the
control plane: a producer slot of this process into every topic owner's ring, so a 200 OK for /pub means the
message is committed to the owner's ring, which loses nothing when either side is killed). Tests pass fakes or the
real thing alike; nothing here imports ``workers``.

Replies follow nsqd's ``http_api.RespondV1``: a string body as is, nothing as an empty 200, a dict as JSON with
``application/json; charset=utf-8``; errors as ``{"message":"<CODE>"}`` (Go's encoding/json bytes) with their
status, raised as ``ApiError`` by the resources and turned into replies in one place (``_on_error``). Methods as
NSQ's router answers them (``http_api/methods.py``: 405 for any method a route does not serve, ``FOO`` too). Every reply carries
``X-NSQ-Content-Type: nsq; version=1.0`` (go-nsq and nsqadmin read replies without the pre-1.0 envelope then).
"""
from __future__ import annotations

import dataclasses
import json
import traceback
from typing import Callable, Optional

import falcon

from nsqpy.http_api import nsqd_resources as R
from nsqpy.http_api.asgi import AsyncMiddleware, AsyncResource, async_handler
from nsqpy.http_api.methods import MethodCheck
from nsqpy.http_api.nsqd_errors import JSON_TYPE, NSQ_CONTENT_TYPE, ApiError, PublishRefused

__all__ = ["create_app", "NsqdDeps", "ApiError", "PublishRefused", "NSQ_CONTENT_TYPE", "JSON_TYPE"]


@dataclasses.dataclass
class NsqdDeps:
    """What the app needs of the broker. ``command`` returns a status name: OK, TOPIC_NOT_FOUND,
    CHANNEL_NOT_FOUND, or anything else for a failure (500 INTERNAL_ERROR)."""

    opts: object                                        # NsqdOptions
    stats: Callable[..., dict]                          # StatsReader.stats
    publish: Callable[[str, list, int], None]           # (topic, bodies, defer_ms); raises PublishRefused
    command: Callable[[str, str, Optional[str]], str]   # (op, topic, channel) -> status name
    info: dict                                          # /info's fields that do not change
    version_line: str = "nsqd v1.3.0"                   # first line of the text /stats
    health: Callable[[], Optional[str]] = lambda: None  # None or the reason the broker is unhealthy
    get_lookupd: Optional[Callable[[], list]] = None    # nsqlookupd_tcp_addresses
    set_lookupd: Optional[Callable[[list], None]] = None
    get_log_level: Callable[[], int] = lambda: 2        # NSQ's LogLevel numbers: 1 debug .. 5 fatal
    set_log_level: Callable[[int], None] = lambda level: None
    metrics: Optional[Callable[[], bytes]] = None       # Prometheus exposition of the broker (http_api/metrics.py)
    log: object = None                                  # nsqpy.log.Logger (errors of the handlers)
    https_port: int = -1                                # the HTTPS listener's port (-1: none)
    # the policy file (workers/storage/policy_file.py's PolicyBook: load, describe, update); None: no
    # /topic/config and /channel/config (404)
    policies: object = None


class _NsqHeader:
    """Adds nsqd's content-type marker to every reply, errors and 404s included."""

    def process_response(self, req, resp, resource, req_succeeded):
        resp.set_header("X-NSQ-Content-Type", NSQ_CONTENT_TYPE)


# Falcon's own errors (no route, wrong method, a malformed request) under nsqd's codes
_STATUS_CODES = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 400: "INVALID_REQUEST", 413: "BODY_TOO_BIG"}


def reply_error(resp, status: int, message: str, plain: bool = False) -> None:
    resp.status = status
    if plain:
        resp.content_type = falcon.MEDIA_TEXT
        resp.text = message
    else:
        resp.content_type = JSON_TYPE
        resp.text = json.dumps({"message": message}, separators=(",", ":"))


def create_app(deps: NsqdDeps, asgi: bool = False):
    """The WSGI app (gunicorn's sync and gthread workers), or with ``asgi`` the same resources as a
    ``falcon.asgi.App`` (gunicorn's asgi worker): each responder there reads the body first, then runs the same
    synchronous code (it blocks the event loop only while it waits for the broker: a ring commit, a fresh stats
    snapshot, a command's answer)."""
    tls_only = int(getattr(deps.opts, "tls_required", 0)) == 2  # TLSRequired.REQUIRED ("tcp-https": HTTP open)
    middleware = [_NsqHeader(), MethodCheck()] + ([_TlsRequired(deps)] if tls_only else [])
    if asgi:
        from falcon import asgi as falcon_asgi
        app = falcon_asgi.App(middleware=[AsyncMiddleware(m) for m in middleware])
    else:
        app = falcon.App(middleware=middleware)
    app.req_options.auto_parse_qs_csv = False

    def on_api_error(req, resp, ex, params):
        reply_error(resp, ex.status, ex.message, ex.plain)

    def on_http_error(req, resp, ex, params):
        status = ex.status_code
        reply_error(resp, status, _STATUS_CODES.get(status, "INTERNAL_ERROR"))
        if status == 405 and ex.headers:
            resp.set_header("Allow", ex.headers.get("Allow", ""))

    def on_crash(req, resp, ex, params):
        if deps.log is not None:  # nsqd: "panic in HTTP handler - ..." and 500 INTERNAL_ERROR
            deps.log.error(f"panic in HTTP handler - {ex!r}: {traceback.format_exc().strip()}")
        reply_error(resp, 500, "INTERNAL_ERROR")

    # Falcon picks the most specific handler: ApiError, then its own HTTPErrors, then anything else
    for kind, handler in ((Exception, on_crash), (falcon.HTTPError, on_http_error), (ApiError, on_api_error)):
        app.add_error_handler(kind, async_handler(handler) if asgi else handler)

    limits = deps.opts.limits()
    body_limit = max(limits.max_body_size, limits.max_msg_size) + 1
    routes = [("/ping", R.Ping(deps)), ("/info", R.Info(deps)), ("/stats", R.Stats(deps)), ("/pub", R.Pub(deps)),
              ("/mpub", R.Mpub(deps))]
    for op in ("create", "delete", "empty", "pause", "unpause"):
        routes += [(f"/topic/{op}", R.TopicCommand(deps, op)), (f"/channel/{op}", R.ChannelCommand(deps, op))]
    routes += [("/topic/config", R.PolicyConfig(deps, channel=False)),
               ("/channel/config", R.PolicyConfig(deps, channel=True))]
    routes += [("/config/{opt}", R.Config(deps)), ("/metrics", R.Metrics(deps))]
    for path, resource in routes:
        app.add_route(path, AsyncResource(resource, body_limit) if asgi else resource)
    return app


class _TlsRequired:
    """--tls-required=true: every plain-HTTP request gets 403 TLS_REQUIRED with the HTTPS port (spec 2.1)."""

    def __init__(self, deps):
        self.body = json.dumps({"message": "TLS_REQUIRED", "https_port": deps.https_port}, separators=(",", ":"))

    def process_request(self, req, resp):
        if req.scheme != "https":
            resp.status = 403
            resp.content_type = JSON_TYPE
            resp.text = self.body
            resp.complete = True
