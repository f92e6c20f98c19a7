"""nsqadmin's HTTP routes (spec 5.1 and 5.2) as a Falcon app over ``nsqpy.admin.service.AdminService``.

    app = create_app(service, static_dir, log)

Every route is prefixed with ``--base-path``. Pages (``/``, ``/topics``, ``/topics/:t``, ``/topics/:t/:c``,
``/nodes``, ``/nodes/:n``, ``/counter``, ``/lookup``) all return the one index page, the UI reads the path;
``/static/:asset`` and ``/fonts/:asset`` serve its files, ``/ping`` says OK. The JSON routes follow NSQ's V1
conventions: ``Content-Type: application/json; charset=utf-8`` and ``X-NSQ-Content-Type: nsq; version=1.0``,
errors as ``{"message": TEXT}`` with the status, mapped in one place (``_on_error``): the service's
``AdminError``, Falcon's 404/405 (NOT_FOUND, METHOD_NOT_ALLOWED) and anything unexpected (500 INTERNAL_ERROR,
logged; never a traceback page). Beyond Go: ``/api/health`` (the health strip) and ``/metrics`` (Prometheus).
"""
from __future__ import annotations

import json
import mimetypes
import os
import posixpath
import string

import falcon

from nsqpy.http_api.lookupd.app import RequestLog
from nsqpy.http_api.query import BadQuery, parse_query
from nsqpy.admin import metrics
from nsqpy.admin.notify import RequestFacts
from nsqpy.admin.service import AdminError
from nsqpy.lookupd.queries import NSQ_VERSION, go_json

__all__ = ["create_app", "PAGES", "STATIC_DIR"]

JSON_TYPE = "application/json; charset=utf-8"
NSQ_CONTENT_TYPE = "nsq; version=1.0"
STATIC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
PAGES = ("/", "/topics", "/topics/{topic}", "/topics/{topic}/{channel}", "/nodes", "/nodes/{node}", "/counter",
         "/lookup")
MAX_BODY = 1024 * 1024 + 1
_TYPES = {".map": "application/json", ".svg": "image/svg+xml", ".woff": "application/font-woff",
          ".ttf": "application/font-sfnt", ".eot": "application/vnd.ms-fontobject", ".woff2": "application/font-woff2",
          ".js": "application/javascript", ".css": "text/css"}


def base_join(base: str, path: str) -> str:
    """Go's path.Join(base, path), as nsqadmin builds its routes: "/" + "/" is "/", "/admin" + "/" "/admin"."""
    return posixpath.normpath(posixpath.join(base or "/", path.lstrip("/"))) if path != "/" else (base or "/")


def normalize_base_path(p: str) -> str:
    if not p:
        return "/"
    if not p.startswith("/"):
        p = "/" + p
    return posixpath.normpath(p).replace("//", "/")


def _reply(resp, value, status=200) -> None:
    resp.status = status
    resp.content_type = JSON_TYPE
    resp.data = go_json(value)
    resp.set_header("X-NSQ-Content-Type", NSQ_CONTENT_TYPE)


def _body(req) -> bytes:
    return req.bounded_stream.read(MAX_BODY)


def _facts(req, acl_header: str) -> RequestFacts:
    port = req.env.get("REMOTE_PORT", "")
    remote = req.remote_addr or ""
    return RequestFacts(method=req.method, host=req.get_header("Host") or req.host,
                        path=req.path, query=req.query_string, remote_addr=f"{remote}:{port}" if port else remote,
                        user_agent=req.user_agent or "", authorization=req.get_header("Authorization") or "",
                        https=req.scheme == "https" or (req.get_header("X-Scheme") or "") == "https",
                        acl_user=req.get_header(acl_header) or "")


def _params(req) -> dict:
    try:
        return parse_query(req.query_string)
    except BadQuery:
        raise AdminError(400, "INVALID_REQUEST") from None


def _first(params, key):
    values = params.get(key)
    return values[0] if values else None


class _Api:
    def __init__(self, svc):
        self.svc = svc

    def facts(self, req):
        return _facts(req, self.svc.opts.acl_http_header)


class Topics(_Api):
    def on_get(self, req, resp):
        _reply(resp, self.svc.topics(inactive=_first(_params(req), "inactive") == "true"))

    def on_post(self, req, resp):
        _reply(resp, self.svc.create(_body(req), self.facts(req)))


class Topic(_Api):
    def on_get(self, req, resp, topic):
        _reply(resp, self.svc.topic(topic))

    def on_post(self, req, resp, topic):
        _reply(resp, self.svc.action(topic, "", _body(req), self.facts(req)))

    def on_delete(self, req, resp, topic):
        _reply(resp, self.svc.delete(topic, "", self.facts(req)))


class Channel(_Api):
    def on_get(self, req, resp, topic, channel):
        _reply(resp, self.svc.channel(topic, channel))

    def on_post(self, req, resp, topic, channel):
        _reply(resp, self.svc.action(topic, channel, _body(req), self.facts(req)))

    def on_delete(self, req, resp, topic, channel):
        _reply(resp, self.svc.delete(topic, channel, self.facts(req)))


class Nodes(_Api):
    def on_get(self, req, resp):
        _reply(resp, self.svc.nodes())


class Node(_Api):
    def on_get(self, req, resp, node):
        _reply(resp, self.svc.node(node))

    def on_delete(self, req, resp, node):
        _reply(resp, self.svc.tombstone(node, _body(req), self.facts(req)))


class Counter(_Api):
    def on_get(self, req, resp):
        _reply(resp, self.svc.counter())


class Health(_Api):
    def on_get(self, req, resp):
        _reply(resp, self.svc.health())


class Graphite(_Api):
    def on_get(self, req, resp):
        p = _params(req)
        _reply(resp, self.svc.graphite_rate(_first(p, "metric"), _first(p, "target")))


class Config(_Api):
    def _answer(self, req, resp, opt):
        body = _body(req) if req.method == "PUT" else None
        _reply(resp, self.svc.config(opt, req.method, body, req.remote_addr or ""))

    on_get = on_put = _answer


class Metrics(_Api):
    def on_get(self, req, resp):
        try:
            topics, warnings, answered, asked = self.svc.cluster_totals()
        except AdminError:
            topics, warnings, answered, asked = [], ["no node answered"], 0, 0
        resp.content_type = metrics.CONTENT_TYPE
        resp.data = metrics.exposition(topics, warnings, answered, asked)


class Ping:
    def on_get(self, req, resp):
        resp.content_type = "text/plain; charset=utf-8"
        resp.data = b"OK"


class Index(_Api):
    """The one page; its settings (base path, version, graphite, whether the user is an admin) go in a JSON
    blob the UI reads."""

    def __init__(self, svc, static_dir, base):
        super().__init__(svc)
        self.static_dir = static_dir
        self.base = base

    def on_get(self, req, resp, **_):
        with open(os.path.join(self.static_dir, "index.html"), encoding="utf-8") as f:
            page = string.Template(f.read())
        o = self.svc.opts
        settings = {"base_path": self.base, "version": NSQ_VERSION, "graph_enabled": bool(o.graphite_url),
                    "graphite_url": o.graphite_url, "proxy_graphite": o.proxy_graphite,
                    "statsd_interval": o.statsd_interval // 1_000_000_000,
                    "statsd_counter_format": o.statsd_counter_format, "statsd_gauge_format": o.statsd_gauge_format,
                    "statsd_prefix": o.statsd_prefix, "nsqlookupd": list(o.lookupd_http_address),
                    "is_admin": self.svc.is_admin(self.facts(req))}
        static = base_join(self.base, "/static")
        blob = json.dumps(settings).replace("<", "\\u003c")
        resp.content_type = "text/html; charset=utf-8"
        resp.text = page.safe_substitute(ROOT="" if self.base == "/" else self.base, STATIC=static, SETTINGS=blob,
                                         VERSION=NSQ_VERSION)


class Static:
    def __init__(self, static_dir, dev_dir=""):
        self.static_dir = static_dir
        self.dev_dir = dev_dir

    def on_get(self, req, resp, asset):
        if "/" in asset or asset.startswith(".") or not asset:
            raise AdminError(404, "NOT_FOUND")
        path = os.path.join(self.dev_dir or self.static_dir, asset)
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            raise falcon.HTTPNotFound() from None
        ext = os.path.splitext(asset)[1]
        resp.content_type = _TYPES.get(ext) or mimetypes.guess_type(asset)[0] or "application/octet-stream"
        resp.data = data


class GraphiteProxy:
    """``--proxy-graphite``: GET /render passed on to the graphite server (basic auth in the URL kept)."""

    def __init__(self, svc):
        self.svc = svc

    def on_get(self, req, resp):
        import base64
        import urllib.error
        import urllib.request
        from urllib.parse import urlsplit

        parts = urlsplit(self.svc.opts.graphite_url)
        url = f"{parts.scheme}://{parts.hostname}{':%d' % parts.port if parts.port else ''}{req.path}"
        url += f"?{req.query_string}" if req.query_string else ""
        headers = {}
        if parts.username:
            token = base64.b64encode(f"{parts.username}:{parts.password or ''}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                        timeout=self.svc.upstream.request_timeout) as up:
                resp.status = up.status
                resp.content_type = up.headers.get("Content-Type", "application/octet-stream")
                resp.data = up.read()
        except urllib.error.HTTPError as e:
            resp.status = e.code
            resp.data = e.read()
        except (OSError, ValueError):
            resp.status = 502
            resp.data = b"Bad Gateway"


def _on_error(log):
    def handle(req, resp, ex, params):
        if isinstance(ex, AdminError):
            status, text = ex.status, ex.text
        elif isinstance(ex, falcon.HTTPError):
            status = ex.status_code
            text = {404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED"}.get(status, "INTERNAL_ERROR")
            if ex.headers:
                resp.set_headers(ex.headers)
        else:
            status, text = 500, "INTERNAL_ERROR"
            if log is not None:
                log.error(f"panic in HTTP handler - {ex!r}")
        _reply(resp, {"message": text}, status)
    return handle


def create_app(svc, log=None, static_dir: str = STATIC_DIR) -> falcon.App:
    base = normalize_base_path(svc.opts.base_path)
    app = falcon.App(middleware=[RequestLog(log)])
    app.resp_options.default_media_type = None
    app.req_options.strip_url_path_trailing_slash = True
    bp = lambda p: base_join(base, p)  # noqa: E731
    index = Index(svc, static_dir, base)
    for page in PAGES:
        app.add_route(bp(page), index)
    app.add_route(bp("/ping"), Ping())
    static = Static(static_dir, svc.opts.dev_static_dir)
    app.add_route(bp("/static/{asset}"), static)
    app.add_route(bp("/fonts/{asset}"), static)
    if svc.opts.proxy_graphite:
        app.add_route(bp("/render"), GraphiteProxy(svc))
    app.add_route(bp("/api/topics"), Topics(svc))
    app.add_route(bp("/api/topics/{topic}"), Topic(svc))
    app.add_route(bp("/api/topics/{topic}/{channel}"), Channel(svc))
    app.add_route(bp("/api/nodes"), Nodes(svc))
    app.add_route(bp("/api/nodes/{node}"), Node(svc))
    app.add_route(bp("/api/counter"), Counter(svc))
    app.add_route(bp("/api/graphite"), Graphite(svc))
    app.add_route(bp("/api/health"), Health(svc))
    app.add_route(bp("/config/{opt}"), Config(svc))
    app.add_route(bp("/metrics"), Metrics(svc))
    handler = _on_error(log)
    app.add_error_handler(Exception, handler)
    app.add_error_handler(falcon.HTTPError, handler)
    return app
