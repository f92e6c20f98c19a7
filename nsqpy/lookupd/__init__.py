"""nsqlookupd: the registration database, the V1 TCP server, the registry process and the ``nsqlookupd`` command.

Modules: ``registration_db`` (the database), ``tcp`` (V1 connections), ``queries`` (the HTTP API's operations
and their unix-socket wire format), ``registry`` (the process owning the database), ``main`` (the command).
"""
