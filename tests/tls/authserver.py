"""A small auth server for the tests: a Falcon app under a real threaded WSGI server on port 0.

Each secret maps to a rule the test sets: a reply (status, JSON) and optionally an Event the request waits on
(a slow server). Every request's parameters are recorded, so tests can check what nsqd sent (spec 10.2)."""
from __future__ import annotations

import json
import socketserver
import threading
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import falcon


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass


class _Threaded(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class AuthServer:
    def __init__(self):
        self.rules = {}        # secret -> {"status": int, "reply": dict, "wait": Event or None}
        self.requests = []     # (method, params dict, headers dict)
        self._cond = threading.Condition()
        app = falcon.App()
        app.add_route("/auth", self)
        self.httpd = make_server("127.0.0.1", 0, app, server_class=_Threaded, handler_class=_Quiet)
        self.address = f"127.0.0.1:{self.httpd.server_port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def allow(self, secret, authorizations, ttl=3600, identity="", identity_url="", wait=None, status=200):
        self.rules[secret] = {"status": status, "wait": wait,
                              "reply": {"ttl": ttl, "identity": identity, "identity_url": identity_url,
                                        "authorizations": authorizations}}

    def _answer(self, req, resp, params):
        with self._cond:
            self.requests.append((req.method, params, dict(req.headers)))
            self._cond.notify_all()
        rule = self.rules.get(params.get("secret"))
        if rule is None:
            resp.status = 403
            resp.media = {"message": "NOT_AUTHORIZED"}
            return
        if rule["wait"] is not None:
            rule["wait"].wait(60)
        resp.status = rule["status"]
        resp.text = json.dumps(rule["reply"])

    def on_get(self, req, resp):
        self._answer(req, resp, dict(req.params))

    def on_post(self, req, resp):
        body = json.loads(req.bounded_stream.read() or b"{}")
        self._answer(req, resp, {k: v[0] for k, v in body.items()} | {"_raw": body})

    def requests_for(self, secret):
        return [r for r in self.requests if r[1].get("secret") == secret]

    def wait_requests(self, secret, n, timeout=30.0):
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.requests_for(secret)) >= n, timeout), \
                f"auth server got {len(self.requests_for(secret))} requests for {secret!r}, not {n}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
