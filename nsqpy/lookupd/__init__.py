"""nsqlookupd: the registration database, the V1 TCP server and the registry process.

Modules: ``registration_db`` (the database), ``tcp`` (V1 connections), ``queries`` (the HTTP API's operations
and their unix-socket wire format), ``registry`` (the process owning the database). The ``nsqlookupd`` command,
which starts the registry and the HTTP API under the broker's supervisor, is ``http_api/lookupd/main.py``.
"""
