"""nsqlookupd's HTTP API: the Falcon app (``app.py``), the gunicorn server that runs it (``server.py``), and the
``nsqlookupd`` command (``main.py``: the supervisor of the registry and the HTTP processes)."""
from http_api.lookupd.app import create_app

__all__ = ["create_app"]
