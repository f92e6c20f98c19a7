"""nsqlookupd's HTTP API (spec 4.2) as a Falcon app (``server.py`` runs it under gunicorn).

    app = create_app(queries, log)     # queries: anything with call(op, *args) -> (status, body)
    app = create_app(queries, log, asgi=True)   # the same as a falcon.asgi.App (gunicorn's asgi worker)

Resources are thin: each route names the operation and its arguments (``ROUTES``), checks the arguments as
nsqlookupd does (query string only, Go's parsing: ``http_api/query.py``) and asks ``queries``, which in the
server is ``RemoteQueries`` (the registry process owns the database and renders the JSON, so every gunicorn worker
sees the same registrations: ``nsqpy/lookupd/registry.py``) and in tests may be a local ``Queries``.

Replies follow NSQ's V1 conventions: a JSON body with ``Content-Type: application/json; charset=utf-8``, an empty
200 for changes, ``{"message": "<CODE>"}`` with the status for errors, and ``X-NSQ-Content-Type: nsq; version=1.0``
on all of them, except ``/ping`` (plain text ``OK`` without that header, as nsqlookupd's PlainText handler).
Errors are mapped in one place (``_error_handler``): NSQ's own (``LookupError_``), Falcon's 404/405 for unknown routes
and methods (NOT_FOUND, METHOD_NOT_ALLOWED: any method a route does not serve, ``FOO`` too, as NSQ's router:
``http_api/methods.py``) and anything unexpected (500 INTERNAL_ERROR). Every request is logged
as nsqlookupd does: ``200 GET /lookup?topic=t (127.0.0.1:40000) 1.2ms``.
"""
from __future__ import annotations

import time

import falcon

from nsqpy.http_api.asgi import AsyncMiddleware, AsyncResource, async_handler
from nsqpy.http_api.methods import MethodCheck
from nsqpy.http_api.query import BadQuery, parse_query
from nsqpy.config.duration import format_duration
from nsqpy.lookupd.queries import go_json
from nsqpy.protocol.names import is_valid_name

__all__ = ["create_app", "ROUTES", "NSQ_CONTENT_TYPE", "JSON_TYPE", "LookupError_"]

NSQ_CONTENT_TYPE = "nsq; version=1.0"
JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"

# argument -> (missing error, validity check or None, invalid error)
_ARGS = {
    "topic": ("MISSING_ARG_TOPIC", None, ""),
    "valid_topic": ("MISSING_ARG_TOPIC", is_valid_name, "INVALID_ARG_TOPIC"),
    "valid_channel": ("MISSING_ARG_CHANNEL", is_valid_name, "INVALID_ARG_CHANNEL"),
    "node": ("MISSING_ARG_NODE", None, ""),
}
_PARAM = {"topic": "topic", "valid_topic": "topic", "valid_channel": "channel", "node": "node"}

# path -> (method, operation of nsqpy/lookupd/queries.py, its arguments in the order NSQ checks them)
ROUTES = {
    "/info": ("GET", "info", ()),
    "/debug": ("GET", "debug", ()),
    "/lookup": ("GET", "lookup", ("topic",)),
    "/topics": ("GET", "topics", ()),
    "/channels": ("GET", "channels", ("topic",)),
    "/nodes": ("GET", "nodes", ()),
    "/topic/create": ("POST", "topic_create", ("valid_topic",)),
    "/topic/delete": ("POST", "topic_delete", ("topic",)),
    "/channel/create": ("POST", "channel_create", ("valid_topic", "valid_channel")),
    "/channel/delete": ("POST", "channel_delete", ("valid_topic", "valid_channel")),
    "/topic/tombstone": ("POST", "topic_tombstone", ("topic", "node")),
}


class LookupError_(Exception):
    """An NSQ HTTP error: status and code (``{"message": code}``)."""

    def __init__(self, status: int, code: str):
        super().__init__(code)
        self.status = status
        self.code = code


def _arguments(req, names) -> list[str]:
    try:
        params = parse_query(req.query_string)
    except BadQuery:
        raise LookupError_(400, "INVALID_REQUEST") from None
    out = []
    for name in names:
        missing, check, invalid = _ARGS[name]
        values = params.get(_PARAM[name])
        if values is None:
            raise LookupError_(400, missing)
        if check is not None and not check(values[0]):
            raise LookupError_(400, invalid)
        out.append(values[0])
    return out


class _Query:
    def __init__(self, queries, op, args):
        self.queries = queries
        self.op = op
        self.args = args

    def _answer(self, req, resp):
        status, body = self.queries.call(self.op, *_arguments(req, self.args))
        if status != 200:
            raise LookupError_(status, body.decode("utf-8", "replace"))
        # a JSON body says so; NSQ's empty 200 carries no Content-Type at all
        resp.content_type = JSON_TYPE if body else None
        resp.data = body
        resp.set_header("X-NSQ-Content-Type", NSQ_CONTENT_TYPE)


class GetQuery(_Query):
    def on_get(self, req, resp):
        self._answer(req, resp)


class PostQuery(_Query):
    def on_post(self, req, resp):
        self._answer(req, resp)


class Ping:
    def on_get(self, req, resp):
        resp.content_type = TEXT_TYPE
        resp.data = b"OK"


class RequestLog:
    """nsqlookupd's line per request (INFO), after the reply is made."""

    def __init__(self, log):
        self.log = log

    def process_request(self, req, resp):
        req.context.started = time.perf_counter_ns()

    def process_response(self, req, resp, resource, req_succeeded):
        started = getattr(req.context, "started", None)
        if self.log is None or started is None:
            return
        uri = req.path + (f"?{req.query_string}" if req.query_string else "")
        remote = f"{req.remote_addr}:{_remote_port(req)}".rstrip(":")
        status = str(resp.status)[:3]  # an int, or a "404 Not Found" string
        self.log.info(f"{status} {req.method} {uri} ({remote}) {format_duration(time.perf_counter_ns() - started)}")


def _remote_port(req):
    env = getattr(req, "env", None)  # WSGI; ASGI has the scope's client (host, port)
    if env is not None:
        return env.get("REMOTE_PORT", "")
    client = req.scope.get("client") or ("", "")
    return client[1]


def _error_handler(log):
    def on_error(req, resp, ex, params):
        """The one place errors become replies: NSQ's V1 error shape for all of them."""
        if isinstance(ex, LookupError_):
            status, code = ex.status, ex.code
        elif isinstance(ex, falcon.HTTPError):
            status = ex.status_code
            code = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(status, "INTERNAL_ERROR")
            if ex.headers:
                resp.set_headers(ex.headers)  # e.g. Allow on a 405, as httprouter sends it
        else:
            status, code = 500, "INTERNAL_ERROR"
            if log is not None:
                log.error(f"panic in HTTP handler - {ex!r}")
        resp.status = status
        resp.content_type = JSON_TYPE
        resp.data = go_json({"message": code})
        resp.set_header("X-NSQ-Content-Type", NSQ_CONTENT_TYPE)
    return on_error


def create_app(queries, log=None, asgi=False):
    """The WSGI app, or with ``asgi`` the same resources as a ``falcon.asgi.App`` (``http_api/asgi.py``: each
    request's registry round trip then runs on the worker's event loop)."""
    middleware = [RequestLog(log), MethodCheck()]
    if asgi:
        from falcon import asgi as falcon_asgi
        app = falcon_asgi.App(middleware=[AsyncMiddleware(m) for m in middleware])
    else:
        app = falcon.App(middleware=middleware)
    app.resp_options.default_media_type = None  # every reply sets its own (or none, as NSQ's empty 200)
    routes = [("/ping", Ping())] + [(path, (GetQuery if method == "GET" else PostQuery)(queries, op, args))
                                    for path, (method, op, args) in ROUTES.items()]
    for path, resource in routes:
        app.add_route(path, AsyncResource(resource) if asgi else resource)
    handler = _error_handler(log)
    if asgi:
        handler = async_handler(handler)
    app.add_error_handler(Exception, handler)
    app.add_error_handler(falcon.HTTPError, handler)  # Falcon's own default for these is more specific
    return app

