"""HTTP methods answered as NSQ's router answers them (julienschmidt/httprouter v1.3.0 with HandleMethodNotAllowed,
as nsqd and nsqlookupd set it up), for nsqd's and nsqlookupd's Falcon apps alike.

On a path that has a route:
* a method the route does not serve, whatever it is (``POST /ping``, ``FOO /ping``): 405 with ``Allow`` listing
  the route's methods and OPTIONS, sorted (``GET, OPTIONS``); the app's error handler gives it NSQ's body,
  ``{"message":"METHOD_NOT_ALLOWED"}``. Falcon alone answers a method it does not know (``FOO``) with 400.
* OPTIONS: 200 with the same ``Allow`` and no body (httprouter's HandleOPTIONS).
A path without a route is 404 NOT_FOUND whatever the method (Falcon's own answer, left alone).

``MethodCheck`` is request middleware: routing has found the resource when ``process_resource`` runs, so it sees
which responders (``on_get``, ...) the resource has (``http_api/asgi.py`` serves it to ``falcon.asgi.App``).
"""
from __future__ import annotations

import falcon

__all__ = ["MethodCheck", "allowed_methods"]

_KNOWN = frozenset(falcon.COMBINED_METHODS) - {"OPTIONS", "WEBSOCKET"}


def _serves(resource, method: str) -> bool:
    return method in _KNOWN and callable(getattr(resource, "on_" + method.lower(), None))


def allowed_methods(resource) -> list[str]:
    """httprouter's Allow list: the route's methods and OPTIONS, sorted."""
    return sorted([m for m in _KNOWN if _serves(resource, m)] + ["OPTIONS"])


class MethodCheck:
    def process_resource(self, req, resp, resource, params):
        if resource is None:
            return
        if req.method == "OPTIONS":
            resp.status = 200
            resp.set_header("Allow", ", ".join(allowed_methods(resource)))
            resp.content_type = None
            resp.complete = True   # no responder runs: httprouter answers OPTIONS itself, with no body
        elif not _serves(resource, req.method):
            raise falcon.HTTPMethodNotAllowed(allowed_methods(resource))
