"""nsqlookupd's HTTP API: the Falcon app (``app.py``), the gunicorn server that runs it (``server.py``), and the
``nsqlookupd`` command (``main.py``: the supervisor of the registry and the HTTP processes)."""

__all__ = ["create_app"]


def __getattr__(name):
    # on first use (PEP 562): the command's supervisor and its registry child import this package, never Falcon
    if name == "create_app":
        from nsqpy.http_api.lookupd.app import create_app
        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
