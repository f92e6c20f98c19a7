"""nsqlookupd's TCP side: one asyncio protocol per nsqd connection, speaking V1 through the sans-IO codec.

Bytes go to ``nsqpy.protocol.v1.V1Parser``; each command it yields goes to its handler (``HANDLERS``: command type
-> method), whose reply bytes are written back. Handlers raise ``ProtocolError``; the one boundary
(``_fail``) sends the V1 error reply (size-prefixed text, no frame type) and closes the connection: every V1
error is fatal. When the connection ends, for whatever reason, every registration it made is dropped (NSQ's
ioloop exit), so a dead nsqd disappears from ``/lookup`` as soon as its TCP connection does.

Semantics are nsqlookupd's (``lookup_protocol_v1.go``): IDENTIFY registers the peer under ("client", "", "") and
stamps its last update; PING refreshes it (only once identified); REGISTER adds the producer to the channel (if
given) and to the topic, without touching the last update; UNREGISTER of a channel removes it there (an
ephemeral channel left with no producer goes entirely); UNREGISTER of a topic removes it from the topic's channels
and the topic (likewise for an ephemeral topic).

Resource handling: replies are tiny, but a peer that never reads could still make us buffer without bound, so
reading pauses while the transport's write buffer is above its high-water mark (``pause_writing``).
"""
from __future__ import annotations

import asyncio
import time

from nsqpy.lookupd.queries import NSQ_VERSION
from nsqpy.lookupd.registration_db import PeerInfo, Producer, Registration, RegistrationDB
from nsqpy.protocol import v1
from nsqpy.protocol.errors import DropConnection, ProtocolError
from nsqpy.protocol.names import is_ephemeral

__all__ = ["LookupServer", "V1Connection", "HANDLERS"]


class LookupServer:
    """What every connection shares: the database, the log, and what IDENTIFY answers about this lookupd."""

    def __init__(self, db: RegistrationDB, log, tcp_port: int, http_port: int, broadcast_address: str,
                 hostname: str):
        self.db = db
        self.log = log
        self.identity = v1.identify_response(tcp_port, http_port, NSQ_VERSION, broadcast_address, hostname)
        self.connections: set[V1Connection] = set()

    def protocol(self) -> "V1Connection":
        return V1Connection(self)

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.transport.close()


def _address(sockname) -> str:
    """Go's net.Addr String(): host:port, IPv6 hosts in brackets."""
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class V1Connection(asyncio.Protocol):
    def __init__(self, server: LookupServer):
        self.server = server
        self.db = server.db
        self.log = server.log
        self.parser = v1.V1Parser()
        self.peer: PeerInfo | None = None
        self.transport = None
        self.remote = "?"
        self.closing = False

    # ---- asyncio callbacks -----------------------------------------------------------------------------
    def connection_made(self, transport):
        self.transport = transport
        self.remote = _address(transport.get_extra_info("peername") or ("?", 0))
        self.server.connections.add(self)
        self.log.info(f"TCP: new client({self.remote})")

    def data_received(self, data):
        if self.closing:
            return
        replies = []  # one write for all the replies to one read: a pipelining nsqd costs one send
        for command in self.parser.feed(data):
            if isinstance(command, ProtocolError):
                self._fail(command, replies)
                return
            try:
                replies.append(HANDLERS[type(command)](self, command))
            except ProtocolError as err:
                self._fail(err, replies)
                return
        if replies:
            self.transport.write(b"".join(replies))

    def eof_received(self):
        return False  # close our side too: V1 has nothing to say after the peer stopped talking

    def connection_lost(self, exc):
        self.server.connections.discard(self)
        self.log.info(f"PROTOCOL(V1): [{self.remote}] exiting ioloop")
        if self.peer is not None:
            for k in self.db.lookup_registrations(self.peer.id):
                removed, _ = self.db.remove_producer(k, self.peer.id)
                if removed:
                    self.log.info(f"DB: client({self.remote}) UNREGISTER category:{k.category} key:{k.key} "
                                  f"subkey:{k.subkey}")

    def pause_writing(self):
        self.transport.pause_reading()

    def resume_writing(self):
        if not self.closing:
            self.transport.resume_reading()

    def _fail(self, err: ProtocolError, replies: list):
        """The error boundary: the replies owed so far, the error's (if it has one), then close; V1 errors are all
        fatal."""
        self.closing = True
        if isinstance(err, DropConnection):
            self.log.error(f"client({self.remote}) - {err.description}")
        else:
            self.log.error(f"[{self.remote}] - {err}")
            replies.append(v1.error_reply(err))
        self.transport.write(b"".join(replies))
        self.transport.close()

    # ---- commands --------------------------------------------------------------------------------------
    def ping(self, cmd: v1.Ping) -> bytes:
        if self.peer is not None:
            now = time.time_ns()
            self.log.info(f"CLIENT({self.peer.id}): pinged (last ping {(now - self.peer.last_update) / 1e9:.6f}s)")
            self.peer.last_update = now
        return v1.OK_REPLY

    def identify(self, cmd: v1.IdentifyV1) -> bytes:
        info = cmd.peer
        self.peer = PeerInfo(id=self.remote, remote_address=self.remote, hostname=info.hostname,
                             broadcast_address=info.broadcast_address, tcp_port=info.tcp_port,
                             http_port=info.http_port, version=info.version)
        self.log.info(f"CLIENT({self.remote}): IDENTIFY Address:{info.broadcast_address} TCP:{info.tcp_port} "
                      f"HTTP:{info.http_port} Version:{info.version}")
        self._add(Registration("client", "", ""))
        return v1.reply(self.server.identity)

    def register(self, cmd: v1.Register) -> bytes:
        if cmd.channel is not None:
            self._add(Registration("channel", cmd.topic, cmd.channel))
        self._add(Registration("topic", cmd.topic, ""))
        return v1.OK_REPLY

    def unregister(self, cmd: v1.Unregister) -> bytes:
        db, peer_id, topic = self.db, self.peer.id, cmd.topic
        if cmd.channel is not None:
            self._remove(Registration("channel", topic, cmd.channel), cmd.channel)
            return v1.OK_REPLY
        # a topic's UNREGISTER: nsqd normally removed its channels first, so any left is worth a warning
        for k in db.find_registrations("channel", topic, "*"):
            removed, _ = db.remove_producer(k, peer_id)
            if removed:
                self.log.warn(f"client({self.remote}) unexpected UNREGISTER category:channel key:{topic} "
                              f"subkey:{k.subkey}")
        self._remove(Registration("topic", topic, ""), topic)
        return v1.OK_REPLY

    def _add(self, k: Registration) -> None:
        if self.db.add_producer(k, Producer(self.peer)):
            self.log.info(f"DB: client({self.remote}) REGISTER category:{k.category} key:{k.key} subkey:{k.subkey}")

    def _remove(self, k: Registration, name: str) -> None:
        removed, left = self.db.remove_producer(k, self.peer.id)
        if removed:
            self.log.info(f"DB: client({self.remote}) UNREGISTER category:{k.category} key:{k.key} "
                          f"subkey:{k.subkey}")
        if left == 0 and is_ephemeral(name):
            self.db.remove_registration(k)


# The dispatch table (V1Parser has already checked IDENTIFY-before-REGISTER and the names).
HANDLERS = {v1.Ping: V1Connection.ping, v1.IdentifyV1: V1Connection.identify, v1.Register: V1Connection.register,
            v1.Unregister: V1Connection.unregister}
