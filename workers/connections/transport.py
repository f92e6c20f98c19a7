"""TLS and compression for V2 connections: the accepting worker keeps the transport, the session talks plaintext.

Theory of operation (ARCHITECTURE.md, "TLS, compression and AUTH"). When IDENTIFY grants tls_v1, snappy or
deflate, the session sends its JSON reply in clear and calls ``upgrade``: the client's TCP socket leaves the
pump and the session, a ``socketpair`` is made, the session goes on with one end (a plain socket the pump reads
like any other: lone PUBs keep the fast path, and at SUB it is handed to the topic's owner by SCM_RIGHTS like any
other socket), and a ``Relay`` in this worker's loop owns the client socket and the other end. The relay runs
the TLS server handshake (``ssl.SSLObject`` over memory BIOs, so it never blocks the loop), sends the ``OK``
frames of the upgrade sequence (spec 1.8: over TLS, then compressed), and from then on copies bytes both ways:
client -> decrypt -> inflate -> socketpair, and socketpair -> deflate/snappy -> encrypt -> client.

Why not move the transport with the socket: an SSLObject's keys and sequence numbers and a zlib stream's state
live in this process's memory and cannot be sent over SCM_RIGHTS; kernel TLS (which would keep them in the
socket) is not available here (no ``tls`` ULP in the kernel, no ``OP_ENABLE_KTLS`` in Python 3.11's ssl).

Crash behaviour: if this worker dies, the client's socket and the relay's end of the pair die with it; the
session at the other end (here or in the owner) sees EOF and closes as for any disconnect, so its in-flight
messages are requeued. An OK the relay had not yet passed on belongs to a publish already committed: at worst
the client publishes it again (a duplicate, never a loss), as for any connection cut after the commit.

Bounds: each direction queues at most ~HIGH_WATER bytes before the relay stops reading the side that feeds it
(TCP then pushes back), and decompression is pulled in READ_CHUNK steps only while the plaintext queue is below
HIGH_WATER, so a decompression bomb costs bounded memory (the inflater keeps the unread input, not its output).
A malformed TLS record, deflate or snappy stream drops the connection and nothing else.
"""
import socket
import ssl
import zlib

from nsqpy.protocol.frames import OK_FRAME
from nsqpy.protocol.snappy_stream import SnappyDecoder, SnappyEncoder, SnappyError
from nsqpy.workers.connections.tls_context import server_context

_VERSION_NAME = {"TLSv1": "TLS1.0", "TLSv1.1": "TLS1.1", "TLSv1.2": "TLS1.2", "TLSv1.3": "TLS1.3"}

READ_CHUNK = 256 * 1024
HIGH_WATER = 1 << 20
HANDSHAKE_DEADLINE = 5.0  # seconds, as nsqd's deadline for the TLS handshake after the IDENTIFY reply

_context = None
RELAYS = set()  # this process's relays (they are referenced by the loop's callbacks too)


def worker_context(worker):
    """This process's SSLContext (built on first use, after fork)."""
    global _context
    if _context is None:
        _context = server_context(worker.opts)
    return _context


class Deflate:
    """Raw DEFLATE both ways (wbits -15), sync-flushed after every write batch as nsqd's flate writer is."""

    def __init__(self, level):
        self._c = zlib.compressobj(level, zlib.DEFLATED, -15)
        self._d = zlib.decompressobj(-15)
        self._tail = b""

    def encode(self, data):
        return self._c.compress(data) + self._c.flush(zlib.Z_SYNC_FLUSH)

    def feed(self, data):
        self._tail = self._tail + data if self._tail else bytes(data)

    @property
    def pending(self):
        return len(self._tail)

    def read(self, limit):
        out = self._d.decompress(self._tail, limit)  # at most limit bytes: the rest stays compressed
        self._tail = self._d.unconsumed_tail
        if self._d.eof:
            raise zlib.error("the client ended its deflate stream")
        return out


class Snappy:
    def __init__(self):
        self._e, self._d = SnappyEncoder(), SnappyDecoder()
        self.encode, self.feed, self.read = self._e.encode, self._d.feed, self._d.read

    @property
    def pending(self):
        return self._d.pending


def codec_for(settings):
    if settings.snappy:
        return Snappy()
    if settings.deflate:
        return Deflate(settings.deflate_level)
    return None


def upgrade(session, leftover):
    """IDENTIFY granted an upgrade: move the session onto a socketpair and relay its client (module docstring)."""
    worker = session.worker
    session.flush()  # the JSON reply goes out in clear, before the handshake
    if session.closed:
        return  # the client went away meanwhile
    raw_prefix = bytes(session.wbuf)  # (what the socket did not take: the relay sends it first)
    session.wbuf.clear()
    client = session.sock
    worker.pump.remove(session)
    worker.loop.forget(session.fd)
    session.writing = False
    outer, inner = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    outer.setblocking(False)
    inner.setblocking(False)
    session.sock, session.fd = inner, inner.fileno()
    ctx = worker_context(worker) if session.settings.tls_v1 else None
    relay = Relay(worker, client, outer, ctx, codec_for(session.settings), session)
    session.start_relayed()
    relay.start(raw_prefix, leftover)


class Relay:
    def __init__(self, worker, client, outer, ctx, codec, session):
        self.worker, self.loop, self.log = worker, worker.loop, worker.log
        self.client, self.outer = client, outer
        self.cfd, self.ofd = client.fileno(), outer.fileno()
        self.codec = codec
        self.session = session  # told the TLS details once the handshake is done (stats, auth's common_name)
        self.remote = session.remote_text
        self._in = self._out = self.tls = None
        if ctx is not None:
            self._in, self._out = ssl.MemoryBIO(), ssl.MemoryBIO()
            self.tls = ctx.wrap_bio(self._in, self._out, server_side=True)
        self.handshaking = self.tls is not None
        self.to_client = bytearray()  # wire bytes (encrypted/compressed) for the client
        self.to_inner = bytearray()   # plaintext for the session
        self.reading_client = self.reading_inner = False
        self.client_eof = self.inner_eof = False
        self._outer_shut = False
        self.closed = False
        self._deadline = None

    # ---- start and the upgrade sequence ----------------------------------------------------------------------
    def start(self, raw_prefix, leftover):
        self.to_client += raw_prefix
        RELAYS.add(self)
        self._read_from_client(True)
        if self.handshaking:
            self._deadline = self.loop.call_later(HANDSHAKE_DEADLINE, self._handshake_timeout)
        else:
            self._established()
        if leftover:
            self._from_client(leftover)
        self._flush_client()

    def _established(self):
        self.handshaking = False
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self.tls is not None:
            self._secure(OK_FRAME)  # spec 1.8: OK over TLS, before any compression
            self.session.tls_established(self._tls_details())
        if self.codec is not None:
            self._secure(self.codec.encode(OK_FRAME))
        self._read_from_inner(True)

    def _tls_details(self):
        cert = self.tls.getpeercert() or {}
        cn = ""
        for rdn in cert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    cn = value
        return {"tls_version": _VERSION_NAME.get(self.tls.version(), self.tls.version() or ""),
                "tls_cipher_suite": (self.tls.cipher() or ("",))[0],
                "tls_negotiated_protocol": self.tls.selected_alpn_protocol() or "",
                "tls_negotiated_protocol_is_mutual": True, "common_name": cn}

    def _handshake_timeout(self):
        self._deadline = None
        if self.handshaking and not self.closed:
            self.log.info(f"PROTOCOL(V2): [{self.remote}] TLS handshake timed out; closing")
            self.close()

    # ---- client -> session -------------------------------------------------------------------------------
    def _read_from_client(self, on):
        if on != self.reading_client and not self.closed:
            self.reading_client = on
            if on:
                self.loop.add_reader(self.cfd, self._on_client)
            else:
                self.loop.remove_reader(self.cfd)

    def _on_client(self):
        try:
            data = self.client.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        if not data:
            self.client_eof = True
            self._read_from_client(False)
            self._flush_inner()
            return
        self._from_client(data)
        self._flush_client()

    def _from_client(self, data):
        try:
            if self.tls is None:
                self._plain_from_client(data)
                return
            self._in.write(data)
            if self.handshaking:
                try:
                    self.tls.do_handshake()
                except ssl.SSLWantReadError:
                    return
                finally:
                    self.to_client += self._out.read()
                self._established()
            while True:
                try:
                    plain = self.tls.read(READ_CHUNK)
                except ssl.SSLWantReadError:
                    break
                except ssl.SSLZeroReturnError:  # close_notify: the client is done sending
                    self.client_eof = True
                    self._read_from_client(False)
                    break
                if not plain:
                    break
                self._plain_from_client(plain)
            self.to_client += self._out.read()
        except (ssl.SSLError, zlib.error, SnappyError, OSError) as e:
            self.log.info(f"PROTOCOL(V2): [{self.remote}] bad TLS or compressed stream ({e}); closing")
            self.close()

    def _plain_from_client(self, data):
        if self.codec is None:
            self.to_inner += data
        else:
            self.codec.feed(data)
            self._inflate()
        self._flush_inner()

    def _inflate(self):
        """Pull plaintext from the decompressor only while the session keeps up (bounded memory)."""
        while len(self.to_inner) < HIGH_WATER:
            chunk = self.codec.read(READ_CHUNK)
            if not chunk:
                break
            self.to_inner += chunk

    def _flush_inner(self):
        if self.closed:
            return
        if self.to_inner:
            try:
                sent = self.outer.send(self.to_inner)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close()
                return
            del self.to_inner[:sent]
            if self.codec is not None and len(self.to_inner) < HIGH_WATER:
                try:
                    self._inflate()
                except (zlib.error, SnappyError) as e:
                    self.log.info(f"PROTOCOL(V2): [{self.remote}] bad compressed stream ({e}); closing")
                    self.close()
                    return
        backlog = len(self.to_inner) + (self.codec.pending if self.codec is not None else 0)
        if self.to_inner:
            self.loop.add_writer(self.ofd, self._flush_inner)
        else:
            self.loop.remove_writer(self.ofd)
            if self.client_eof and not self._outer_shut:
                # everything the client sent was passed on: the session reads EOF, answers what it has and
                # closes its end, and then the relay sends that and closes (as a plain session does)
                self._outer_shut = True
                try:
                    self.outer.shutdown(socket.SHUT_WR)
                except OSError:
                    self.close()
                    return
        self._read_from_client(backlog < HIGH_WATER and not self.client_eof)

    # ---- session -> client -------------------------------------------------------------------------------
    def _read_from_inner(self, on):
        if on != self.reading_inner and not self.closed:
            self.reading_inner = on
            if on:
                self.loop.add_reader(self.ofd, self._on_inner)
            else:
                self.loop.remove_reader(self.ofd)

    def _on_inner(self):
        try:
            data = self.outer.recv(READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the session closed (an error frame may still be queued for the client)
            self.inner_eof = True
            self._read_from_inner(False)
            self._flush_client()
            if not self.closed:  # a client that does not read its last frames is not waited for long
                self._deadline = self.loop.call_later(HANDSHAKE_DEADLINE, self.close)
            return
        self._secure(self.codec.encode(data) if self.codec is not None else data)
        self._flush_client()

    def _secure(self, data):
        if self.tls is None:
            self.to_client += data
            return
        view = memoryview(data)
        while view:
            n = self.tls.write(view)
            view = view[n:]
        self.to_client += self._out.read()

    def _flush_client(self):
        if self.closed:
            return
        if self.to_client:
            try:
                sent = self.client.send(self.to_client)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close()
                return
            del self.to_client[:sent]
        if self.to_client:
            self.loop.add_writer(self.cfd, self._flush_client)
        else:
            self.loop.remove_writer(self.cfd)
            if self.inner_eof:
                self.close()
                return
        if not self.handshaking:
            self._read_from_inner(len(self.to_client) < HIGH_WATER and not self.inner_eof)

    # ---- teardown ----------------------------------------------------------------------------------------
    def close(self):
        if self.closed:
            return
        self.closed = True
        if self._deadline is not None:
            self._deadline.cancel()
        for sock, fd in ((self.client, self.cfd), (self.outer, self.ofd)):
            self.loop.forget(fd)
            try:
                sock.close()
            except OSError:
                pass
        RELAYS.discard(self)
