"""Synchronous Falcon parts served by ``falcon.asgi.App``: the same resources, middleware and error handlers, their
methods wrapped as coroutines. nsqd's and nsqlookupd's apps are written once, synchronously (their work is a short
wait for the broker or the registry), and served by gunicorn's asgi worker as well as by its sync and gthread ones.

    app = falcon.asgi.App(middleware=[AsyncMiddleware(m) for m in middleware])
    app.add_route(path, AsyncResource(resource, body_limit))
    app.add_error_handler(kind, async_handler(handler))

A wrapped method runs the synchronous one on the event loop: it blocks the loop for as long as it takes, which is
what these apps want (no thread hand-off per request), and only the request's own reading and writing wait on
the client.
"""
from __future__ import annotations

import types

__all__ = ["AsyncResource", "AsyncMiddleware", "async_handler"]

_RESPONDERS = ("on_get", "on_post", "on_put", "on_delete", "on_patch", "on_head")
_MIDDLEWARE = ("process_request", "process_resource", "process_response")


class AsyncResource:
    """A resource's responders as coroutines. With ``body_limit``, the body is read first (at most that many
    bytes, and not at all when Content-Length already says it is bigger) into ``req.context.body``."""

    def __init__(self, resource, body_limit=None):
        for name in _RESPONDERS:
            fn = getattr(resource, name, None)
            if fn is not None:
                setattr(self, name, self._wrap(fn, body_limit))

    @staticmethod
    def _wrap(fn, limit):
        async def responder(req, resp, **params):
            if limit is not None and (req.content_length or 0) < limit:
                req.context.body = await req.stream.read(limit)
            fn(req, resp, **params)
        return responder


class AsyncMiddleware:
    """A middleware object's process_* methods as coroutines: only those it has, bound to this object (Falcon
    looks them up by name and wants bound methods)."""

    def __init__(self, middleware):
        for name in _MIDDLEWARE:
            fn = getattr(middleware, name, None)
            if fn is not None:
                setattr(self, name, types.MethodType(_coroutine(fn), self))


def async_handler(handler):
    async def run(req, resp, ex, params, ws=None):
        handler(req, resp, ex, params)
    return run


def _coroutine(fn):
    async def run(self, *args):
        fn(*args)
    return run
