"""What other processes (the HTTP API, statsd, tools) read of a running broker, without being part of it.

Modules here use ``ipc`` and ``nsqpy.protocol``, never ``workers``: the broker's processes write what these
modules read (``stats``: the stats plane).
"""
