"""The HTTP API's operations on the registration database, answered where the database lives.

Every HTTP process asks the one process that owns the database (``nsqpy/lookupd/registry.py``) and gets back the
exact reply body, so all of them see the same registrations at the same moment and none keeps a copy to go stale.
``Queries.call(op, *args) -> (status, body)``: 200 with the JSON body NSQ sends (``b""`` for NSQ's empty 200), or
an error status with NSQ's error text (``TOPIC_NOT_FOUND``), which the HTTP app wraps as ``{"message": ...}``.
Argument checks that need no database (MISSING_ARG_TOPIC, INVALID_ARG_TOPIC) are the HTTP app's.

JSON is Go's ``encoding/json``: compact, maps with sorted keys, structs in field order, ``<``, ``>``, ``&``,
U+2028 and U+2029 escaped, other non-ASCII as UTF-8.

Wire format between an HTTP process and the owner (a unix stream socket, one request at a time per connection):

    request    u32 length, then a JSON array [op, arg, ...] (args are strings)
    reply      u16 status, u32 length, then the body
"""
from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time

from nsqpy.lookupd.registration_db import Registration, RegistrationDB, filter_by_active

__all__ = ["Queries", "RemoteQueries", "go_json", "REQUEST", "REPLY", "encode_request", "MAX_REQUEST", "NSQ_VERSION"]

NSQ_VERSION = "1.3.0"
REQUEST = struct.Struct(">I")
REPLY = struct.Struct(">HI")
MAX_REQUEST = 1 << 20   # an HTTP query string is far shorter (gunicorn refuses request lines over 4 KiB)
_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                             "\u2029": "\\u2029"})


def go_json(value) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).translate(_GO_ESCAPES).encode(
        "utf-8", "replace")


def encode_request(op: str, *args: str) -> bytes:
    body = json.dumps([op, *args]).encode()
    return REQUEST.pack(len(body)) + body


def _peer_info(p) -> dict:
    peer = p.peer
    return {"remote_address": peer.remote_address, "hostname": peer.hostname,
            "broadcast_address": peer.broadcast_address, "tcp_port": peer.tcp_port, "http_port": peer.http_port,
            "version": peer.version}


class Queries:
    """The operations, over one RegistrationDB. ``log`` has NSQ's levels (nsqpy.log.Logger) or is None."""

    def __init__(self, db: RegistrationDB, inactive_producer_timeout: int, tombstone_lifetime: int, log=None):
        self.db = db
        self.inactive_producer_timeout = inactive_producer_timeout
        self.tombstone_lifetime = tombstone_lifetime
        self.log = log
        self.ops = {"info": self.info, "topics": self.topics, "channels": self.channels, "lookup": self.lookup,
                    "nodes": self.nodes, "debug": self.debug, "topic_create": self.topic_create,
                    "topic_delete": self.topic_delete, "channel_create": self.channel_create,
                    "channel_delete": self.channel_delete, "topic_tombstone": self.topic_tombstone}

    def call(self, op: str, *args: str) -> tuple[int, bytes]:
        handler = self.ops.get(op)
        if handler is None:
            return 500, b"INTERNAL_ERROR"
        try:
            return handler(*args)
        except TypeError:  # wrong number of arguments: a bug of the caller, not of the database
            return 500, b"INTERNAL_ERROR"

    def _info(self, line: str) -> None:
        if self.log is not None:
            self.log.info(line)

    # ---- reads -----------------------------------------------------------------------------------------
    def info(self):
        return 200, go_json({"version": NSQ_VERSION})

    def topics(self):
        return 200, go_json({"topics": [k.key for k in self.db.find_registrations("topic", "*", "")]})

    def channels(self, topic):
        return 200, go_json({"channels": [k.subkey for k in self.db.find_registrations("channel", topic, "*")]})

    def lookup(self, topic):
        db = self.db
        if not db.find_registrations("topic", topic, ""):
            return 404, b"TOPIC_NOT_FOUND"
        channels = [k.subkey for k in db.find_registrations("channel", topic, "*")]
        producers = filter_by_active(db.find_producers("topic", topic, ""), self.inactive_producer_timeout,
                                     self.tombstone_lifetime)
        return 200, go_json({"channels": channels, "producers": [_peer_info(p) for p in producers]})

    def nodes(self):
        db = self.db
        now = time.time_ns()
        # tombstones are not filtered out here: /nodes shows them, flagged (lifetime 0 keeps them)
        nodes = []
        for p in filter_by_active(db.find_producers("client", "", ""), self.inactive_producer_timeout, 0, now):
            topics = [k.key for k in db.lookup_registrations(p.peer.id) if k.category == "topic"]
            tombstones = []
            for t in topics:
                tp = db.producer(Registration("topic", t, ""), p.peer.id)
                tombstones.append(tp is not None and tp.is_tombstoned(self.tombstone_lifetime, now))
            node = _peer_info(p)
            node["tombstones"] = tombstones
            node["topics"] = topics
            nodes.append(node)
        return 200, go_json({"producers": nodes})

    def debug(self):
        data = {}
        for k, producers in self.db.map.items():
            if not producers:
                continue  # NSQ builds the map by appending producers: empty registrations do not show
            data[f"{k.category}:{k.key}:{k.subkey}"] = [
                {"broadcast_address": p.peer.broadcast_address, "hostname": p.peer.hostname,
                 "http_port": p.peer.http_port, "id": p.peer.id, "last_update": p.peer.last_update,
                 "tcp_port": p.peer.tcp_port, "tombstoned": p.tombstoned, "tombstoned_at": p.tombstoned_at,
                 "version": p.peer.version} for p in producers.values()]
        return 200, go_json(dict(sorted(data.items())))

    # ---- changes ---------------------------------------------------------------------------------------
    def topic_create(self, topic):
        self._info(f"DB: adding topic({topic})")
        self.db.add_registration(Registration("topic", topic, ""))
        return 200, b""

    def topic_delete(self, topic):
        db = self.db
        for k in db.find_registrations("channel", topic, "*"):
            self._info(f"DB: removing channel({k.subkey}) from topic({topic})")
            db.remove_registration(k)
        for k in db.find_registrations("topic", topic, ""):
            self._info(f"DB: removing topic({topic})")
            db.remove_registration(k)
        return 200, b""

    def channel_create(self, topic, channel):
        self._info(f"DB: adding channel({channel}) in topic({topic})")
        self.db.add_registration(Registration("channel", topic, channel))
        self._info(f"DB: adding topic({topic})")
        self.db.add_registration(Registration("topic", topic, ""))
        return 200, b""

    def channel_delete(self, topic, channel):
        regs = self.db.find_registrations("channel", topic, channel)
        if not regs:
            return 404, b"CHANNEL_NOT_FOUND"
        self._info(f"DB: removing channel({channel}) from topic({topic})")
        for k in regs:
            self.db.remove_registration(k)
        return 200, b""

    def topic_tombstone(self, topic, node):
        self._info(f"DB: setting tombstone for producer@{node} of topic({topic})")
        for p in self.db.find_producers("topic", topic, ""):
            if f"{p.peer.broadcast_address}:{p.peer.http_port}" == node:
                p.tombstone()
        return 200, b""



class RemoteQueries:
    """``Queries`` asked of the registry process over its unix socket: what each HTTP worker holds.

    One connection per process (made lazily, so a gunicorn worker forked from the arbiter makes its own) and one
    request at a time (a lock, for threaded workers). A connection that fails (the registry restarted) is made
    anew once; if that fails too, the error reaches the HTTP app, which answers 500 INTERNAL_ERROR."""

    def __init__(self, address: str, timeout: float = 5.0):
        self.address = address
        self.timeout = timeout
        self._sock = None
        self._pid = 0
        self._lock = threading.Lock()

    def call(self, op: str, *args: str) -> tuple[int, bytes]:
        request = encode_request(op, *args)
        with self._lock:
            for attempt in (1, 2):
                try:
                    sock = self._connected()
                    sock.sendall(request)
                    status, size = REPLY.unpack(_recv_exactly(sock, REPLY.size))
                    return status, _recv_exactly(sock, size)
                except OSError:
                    self.close()
                    if attempt == 2:
                        raise

    def _connected(self) -> socket.socket:
        if self._sock is None or self._pid != os.getpid():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            sock.connect(self.address)
            self._sock, self._pid = sock, os.getpid()
        return self._sock

    def close(self) -> None:
        if self._sock is not None and self._pid == os.getpid():
            self._sock.close()
        self._sock = None


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the registry closed the connection")
        buf += chunk
    return bytes(buf)
