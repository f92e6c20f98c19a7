"""nsqlookupd's HTTP API: the Falcon app (``app.py``) and the gunicorn server that runs it (``server.py``)."""
from http_api.lookupd.app import create_app

__all__ = ["create_app"]
