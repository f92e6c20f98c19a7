"""One V2 client connection inside a worker: bytes in through the sans-IO parser, commands dispatched by a table,
replies and message frames out through a write buffer.

Theory of operation: the worker's pump (``workers/lane/pump.py``) reads the socket; a lone PUB it publishes and answers
itself, everything else arrives in ``on_data``. One read may hold hundreds of commands, which are parsed in one
``feed`` (FIN runs and MPUBs come out as batch commands) and handled in order. Replies are appended to ``wbuf``
and the session is marked dirty (and ``busy`` for the pump, so its OKs queue behind); the worker flushes every
dirty session once per loop iteration, so a pipelined burst of PUBs is answered with one ``send``. Message frames
are written by the channel straight into the same buffer. Handlers raise ``ProtocolError``; ``_fail`` is the one
boundary that turns an error into an error frame and, when it is fatal, closes the connection once the frame is
flushed (replies still queued before it go out first, also for a silent drop). Until then the socket is still
read, but what arrives is discarded: the parser takes nothing after a fatal error, and closing with unread bytes
would be a reset that destroys what the client has not read yet. For the same reason the close itself lingers:
once the error frame is sent the session shuts its side down (FIN after the queued bytes) and reads on, discarding,
until the client closes or LINGER seconds pass (bytes it sent while its output was backed up, when the socket was
not read, would otherwise still be unread at the close).

Heartbeats: one timer per session sends ``_heartbeat_`` every heartbeat interval to every client, producers
included, and enforces NSQ's read deadline: a client has two intervals for a whole command (nsqd sets the socket
deadline before it reads each command line, and reads the body under the same deadline). Between commands (the
parser idle) the deadline is two intervals after the last read, which the pump records on every recv; while a
command is partly received it is two intervals after the read that began it (``_command_started``), so a client
trickling a command byte by byte is dropped like a silent one. Keeping that time costs one comparison per
``on_data``; the pump's fast path only ever handles whole commands, with the parser idle.

Back-pressure (a full ring to a topic's owner): a publish the worker cannot commit yet is *parked*
(``workers/processes/worker.py``: it keeps a copy of the messages); the session is then *held*: its socket leaves the pump,
so nothing more is read and TCP pushes back on the producer, and the commands already parsed after the publish wait
in ``_held_items``, in order. When the owner has made room the worker commits the publish, sends the OK and
``release``s the session, which handles those commands and only then reads again. While held, no read deadline
runs (the client is waiting for us, as nsqd's is while it writes to disk); heartbeats still go out. A session
closed while held loses its parked publish unanswered.

TLS and compression (``workers/connections/transport.py``): when IDENTIFY grants one, the session hands its client socket to a
relay in this worker and goes on with one end of a socketpair, reading plaintext like any other session (the
pump's fast path included). AUTH (``workers/connections/auth.py``, mixed in as ``SessionAuth``): the auth server is asked off
the loop while the session is held, as for a parked publish; with --auth-http-address or --tls-required (before
the upgrade) the pump's fast path is off for the session, since it makes neither check.

What a session uses of its worker is declared in ``hosts.SessionHost`` (the pump's arrays, the loop, publish,
subscribe, hand-over), so a unit test runs it on a socketpair with a small fake (tests/workers/test_session.py).

Resource handling: ``close`` is idempotent; it requeues the session's in-flight messages at once (nsqpy goes
beyond NSQ here), leaves its channel, takes the fd out of the pump and the loop and closes the socket.
"""
import socket
import time
from time import monotonic

from nsqpy.protocol import commands as C
from nsqpy.protocol.errors import FinFailed, Invalid, ProtocolError, PubFailed
from nsqpy.protocol.frames import CLOSE_WAIT_FRAME, HEARTBEAT_FRAME, OK_FRAME, response_frame
from nsqpy.protocol.identify import default_client_settings, negotiate_identify
from nsqpy.protocol.states import STATE_SUBSCRIBED
from nsqpy.protocol.v2_parser import V2Parser
from nsqpy.workers.connections.auth import SessionAuth
from nsqpy.workers.connections.transport import upgrade
from nsqpy.workers.domain.hosts import SessionHost

# A client that stops reading must not make the broker buffer without bound: past this many unsent bytes the
# session stops reading commands (and so stops publishing) until the socket drains.
MAX_WBUF = 4 * 1024 * 1024
LINGER = 2.0   # seconds a session closing after a fatal error waits for the client to close first
VERB = {cls: verb for verb, cls in C.VERBS.items()} | {C.FinBatch: "FIN"}


FIN_LINE = len(b"FIN 0123456789abcdef\n")


class Session(SessionAuth):
    def __init__(self, worker: SessionHost, sock, conn_id, remote, parser=None, settings=None, connect_ts=None):
        self.worker = worker
        self.sock = sock
        self.fd = sock.fileno()
        self.conn_id = conn_id
        self.remote = remote
        self.parser = parser or V2Parser(worker.limits, stop_after_sub=True)
        self.settings = settings or default_client_settings(worker.server_settings, remote[0])
        self.connect_ts = connect_ts or int(time.time())
        self.wbuf = bytearray()
        self.closed = False
        self.closing_after_flush = False
        self._linger_timer = None
        self.reading = True
        self.held = False          # a publish waits for room in the ring to its topic's owner: not reading
        self.moved_in = False      # a producer moved here because this worker owns its topics (auto placement)
        self.moved_in_took = 0.0   # ... and the seconds its last window of lone PUBs took before (the pump's)
        self.stay_out = False      # a producer moved in once and out again: it does not move in again
        self._held_items = None    # commands parsed after that publish, handled once it is committed
        self._held_bytes = b""     # bytes handed to on_data while held (not from the pump, which stops reading)
        self.writing = False  # the loop watches for room to send the rest of wbuf
        self.channel = None
        self.rdy = 0
        self.in_flight = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0
        self.pub_counts = {}
        self._hb_timer = None
        self._next_heartbeat = None
        self._command_started = 0.0  # time.monotonic() of the read that began the partly received command
        self.auth = None         # AuthState once an AUTH succeeded (workers/connections/auth.py)
        self.auth_secret = None  # the AUTH body, for asking again once the state's TTL has passed
        self.common_name = ""    # the client certificate's CN, sent to the auth server
        self.stats_extra = None  # TLS details and auth identity for /stats (replaced, never mutated)
        self._tls_missing = worker.server_settings.tls_required and not self.settings.tls_v1  # (--tls-required)
        self._auth_on = worker.server_settings.auth_required  # (--auth-http-address)
        self._dispatch = {
            C.Identify: self.on_identify, C.Auth: self.on_auth, C.Sub: self.on_sub, C.Pub: self.on_pub,
            C.Mpub: self.on_mpub, C.Dpub: self.on_dpub, C.Rdy: self.on_rdy, C.Fin: self.on_fin,
            C.FinBatch: self.on_fin_batch, C.Req: self.on_req, C.Touch: self.on_touch, C.Cls: self.on_cls,
            C.Nop: self.on_nop,
        }

    @property
    def state(self):
        return self.parser.state

    # ---- I/O -------------------------------------------------------------------------------------------
    def start(self, pending=b""):
        now = monotonic()
        self.worker.pump.add(self, now)
        self._command_started = now  # the magic (or a moved connection's pending command) counts from here
        self._arm_heartbeat()
        if pending:
            self.on_data(pending)
        else:
            self._note_clean()

    @property
    def last_read(self):
        """time.monotonic() of the last read (the pump records it)."""
        return float(self.worker.pump.last_read[self.fd])

    @property
    def read_deadline_from(self):
        """Where the read deadline counts from: the last read at a command boundary, else the read that began the
        command still being received. While held, it is now: the client waits for us, not we for it."""
        if self.held:
            return monotonic()
        return self.last_read if self.parser.idle else self._command_started

    def on_data(self, data):
        """Bytes the pump read for this session (everything but the lone PUBs it handled itself)."""
        if self.closing_after_flush:
            # After a fatal error nothing more is parsed (the parser refuses input), but reading on until the
            # close keeps unread bytes from turning it into a reset that would destroy the error frame and
            # whatever else the client has not read yet.
            return
        if self.held:
            self._held_bytes += data
            return
        if len(data) == FIN_LINE and data.startswith(b"FIN ") and data[-1] == 10 and self.fin_fast_path():
            # one whole FIN, an unbuffered consumer's every read: straight to the channel, not through the parser
            # (nothing to keep between reads). One that fails goes the general way below, which answers it.
            try:
                self.channel.finish_one(self, data[4:20])
                return
            except FinFailed:
                pass
        was_idle = self.parser.idle
        if self.handle_bytes(data) or was_idle:
            # a command began in this read (the parser was idle, or finished a command in it): if that command is
            # still partial, its deadline counts from now; if the parser is idle, this value is not used
            self._command_started = self.last_read
        self._note_clean()

    def fin_fast_path(self, lane_channel=None):
        """Whether a read that is one whole ``FIN <id>\\n`` may skip the parser: the one eligibility rule of every
        fast FIN path (``on_data``'s, straight to the channel; the lane's, ``workers/lane/ownpath.py``, which frees
        it in compiled code). Subscribed, nothing half parsed, not held (a parked publish's commands wait in
        order), not closing after a fatal error, and no TLS upgrade pending (--tls-required makes a FIN fatal
        before it). ``lane_channel``: the channel the lane would free it on; the lane records no end-to-end
        latency, so a channel with a window (``Channel.e2e``) keeps its FINs in Python. Reads plain fields only
        (a FIN's hot path: one call, no property of ours)."""
        p = self.parser
        return p.state == STATE_SUBSCRIBED and p.idle and not self.held and not self.closing_after_flush and \
            not self._tls_missing and (lane_channel is None or lane_channel.e2e is None)

    def _note_clean(self):
        """Tell the pump whether it may handle this session's next lone PUB itself (nothing half parsed, and no
        per-command check the pump does not make: AUTH's permissions, --tls-required before the upgrade)."""
        if not self.closed:
            self.worker.pump.clean[self.fd] = self.parser.idle and not self.closing_after_flush and \
                not self._auth_on and not self._tls_missing

    def handle_bytes(self, data):
        """Parse and handle data; returns whether it completed at least one command."""
        items = self.parser.feed(data)
        completed = bool(items)
        self._handle(items)
        return completed

    def _handle(self, items):
        while items:
            for k, cmd in enumerate(items):
                if self.closed or self.closing_after_flush:
                    return
                if isinstance(cmd, ProtocolError):
                    self._fail(cmd)
                    return
                try:
                    if self._tls_missing and type(cmd) is not C.Identify:
                        raise Invalid(f"cannot {VERB[type(cmd)]} in current state (TLS required)")
                    result = self._dispatch[type(cmd)](cmd)
                    if result is MIGRATED:
                        # the parser stops right after a SUB, so all not yet handled is still in its buffer
                        self.worker.migrate(self, cmd, self.parser.take_buffer())
                        return
                    if result is UPGRADED:
                        if k + 1 < len(items):  # commands pipelined after it were not the TLS/compressed stream
                            self.close()
                            return
                        upgrade(self, self.parser.take_buffer())  # what is buffered belongs to the new stream
                        return
                    if result is AUTH_PENDING:  # asking the auth server again: this command waits for it
                        self._held_items = items[k:]
                        return
                except ProtocolError as err:
                    self._fail(err)
                    if err.fatal:
                        return
                if self.held:  # that publish was parked: the rest waits for its OK (a SUB is always last)
                    self._held_items = items[k + 1:]
                    return
            # a SUB that kept the connection here: parse the rest of what was received
            items = self.parser.feed(b"") if type(items[-1]) is C.Sub else None
        if len(self.wbuf) > MAX_WBUF and self.reading:
            self.reading = False
            self.worker.pump.pause(self.fd)

    def write(self, data):
        if self.closed:
            return  # its fd may already belong to another connection
        if not self.wbuf:
            self.worker.dirty.append(self)
            self.worker.pump.busy[self.fd] = 1  # the pump must not send an OK past queued output
        self.wbuf += data

    def flush(self):
        """Send what the socket takes now; returns True when everything went."""
        if self.closed:
            return True
        if self.wbuf:
            try:
                sent = self.sock.send(self.wbuf)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.close()
                return True
            if sent == len(self.wbuf):
                self.wbuf.clear()
                if not self.closing_after_flush:
                    self.worker.pump.busy[self.fd] = 0
            else:
                del self.wbuf[:sent]
                if not self.writing:
                    self.writing = True
                    self.worker.loop.add_writer(self.fd, self._on_writable)
                return False
        if self.writing:
            self.writing = False
            self.worker.loop.remove_writer(self.fd)
        if self.closing_after_flush:
            self._linger()
        elif not self.reading:
            self.reading = True
            if not self.held:
                self.worker.pump.resume(self.fd)
        return True

    def _on_writable(self):
        self.flush()

    def _linger(self):
        """The fatal error frame went out: shut our side down (the client reads to the end, then EOF) and read on,
        discarding (``on_data``), until the client closes (the pump reports it) or LINGER seconds pass."""
        if self._linger_timer is not None:
            return
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self.close()
            return
        self._linger_timer = self.worker.loop.call_later(LINGER, self.close)
        if not self.reading and not self.held:
            self.reading = True
            self.worker.pump.resume(self.fd)

    def _fail(self, err):
        frame = err.frame()
        if frame:
            self.write(frame)
        if err.fatal:
            self.worker.log.debug(f"[{self.remote_text}] fatal error: {err}")
            self.closing_after_flush = True
            self.worker.pump.clean[self.fd] = 0
            self.worker.pump.busy[self.fd] = 1
            if not self.wbuf:  # a silent drop with nothing pending; otherwise the flush closes, replies first
                self.close()

    @property
    def remote_text(self):
        return f"{self.remote[0]}:{self.remote[1]}"

    # ---- heartbeats ------------------------------------------------------------------------------------
    def _arm_heartbeat(self):
        """(Re)start the schedule: the next ``_heartbeat_`` one interval from now (at start and after IDENTIFY)."""
        interval = self.settings.heartbeat_interval_ms / 1000.0
        self._next_heartbeat = time.monotonic() + interval if interval > 0 else None
        self._schedule_heartbeat()

    def _schedule_heartbeat(self):
        """One timer serves both the next heartbeat and the read deadline (2 intervals, see the module docstring),
        so a silent client is dropped when its deadline passes, not up to an interval later at a heartbeat tick."""
        if self._hb_timer is not None:
            self._hb_timer.cancel()
            self._hb_timer = None
        if self._next_heartbeat is None:
            return
        deadline = self.read_deadline_from + 2 * self.settings.heartbeat_interval_ms / 1000.0
        delay = min(self._next_heartbeat, deadline) - time.monotonic()
        self._hb_timer = self.worker.loop.call_later(max(0.0, delay), self._on_heartbeat)

    def _on_heartbeat(self):
        self._hb_timer = None
        if self.closed:
            return
        interval = self.settings.heartbeat_interval_ms / 1000.0
        now = time.monotonic()
        if now - self.read_deadline_from >= 2 * interval:
            self.worker.log.info(f"PROTOCOL(V2): [{self.remote_text}] read timeout; closing")
            self.close()
            return
        if now >= self._next_heartbeat:
            if not self.closing_after_flush:  # nothing may follow a fatal error frame
                self.write(HEARTBEAT_FRAME)
            self._next_heartbeat = max(self._next_heartbeat + interval, now)
        self._schedule_heartbeat()

    # ---- handlers (one per verb; the parser already checked state, params, names, sizes) ---------------
    def on_identify(self, cmd):
        self.settings, reply = negotiate_identify(cmd.body, self.worker.server_settings, self.settings)
        self._tls_missing = self.worker.server_settings.tls_required and not self.settings.tls_v1
        self.write(response_frame(reply))
        self._arm_heartbeat()
        if self.settings.tls_v1 or self.settings.snappy or self.settings.deflate:
            return UPGRADED

    # ---- TLS and compression (workers/connections/transport.py relays them; this session then speaks plaintext) --------
    def start_relayed(self):
        """``upgrade`` moved this session onto its end of the relay's socketpair: read it like any socket."""
        self.worker.pump.add(self, monotonic())
        self._note_clean()

    def tls_established(self, details):
        self.common_name = details.pop("common_name", "")
        self.stats_extra = {**(self.stats_extra or {}), **details}

    def on_sub(self, cmd):
        if self.settings.heartbeats_disabled:
            raise Invalid("cannot SUB with heartbeats disabled")
        if self._auth_on and not self._authorized("SUB", cmd.topic, cmd.channel):
            return AUTH_PENDING
        return self.worker.subscribe(self, cmd.topic, cmd.channel)

    def on_pub(self, cmd):
        if self._auth_on and not self._authorized("PUB", cmd.topic):
            return AUTH_PENDING
        self.worker.publish(self, cmd.topic, [cmd.body], 0, "PUB")

    def on_mpub(self, cmd):
        if self._auth_on and not self._authorized("MPUB", cmd.topic):
            return AUTH_PENDING
        self.worker.publish_mpub(self, cmd)

    def on_dpub(self, cmd):
        if self._auth_on and not self._authorized("DPUB", cmd.topic):
            return AUTH_PENDING
        self.worker.publish(self, cmd.topic, [cmd.body], cmd.defer_ms, "DPUB")

    def pub_failed(self, topic, verb=(PubFailed, "PUB")):
        """A publish the pump staged was refused: ``verb`` is its (error class, command name)."""
        error, name = verb
        self._fail(error(f"{name} failed topic {topic} is full"))

    # ---- back-pressure: a parked publish (see the module docstring) ----------------------------------------
    def hold(self):
        """A publish of this session was parked: read nothing more until it is committed (``release``)."""
        if not self.held:
            self.held = True
            self.worker.pump.pause(self.fd)

    def release(self):
        """The parked publish was answered (OK, or a fatal error): handle what was parsed after it, then read."""
        if not self.held:
            return
        self.held = False
        if self.closed:
            return
        items, self._held_items = self._held_items, None
        if items:
            self._handle(items)
        if self.held or self.closed:
            return  # parked again (what is left waits for that one), or gone
        data, self._held_bytes = self._held_bytes, b""
        if data:
            self.on_data(data)
            if self.held or self.closed:
                return
        self.worker.pump.last_read[self.fd] = monotonic()  # the read deadline counts from here again
        if self.reading:
            self.worker.pump.resume(self.fd)
        self._note_clean()

    def fail_held(self, err):
        """The parked publish cannot be stored (its topic is full): the error, and nothing after it."""
        self._held_items = None
        self._held_bytes = b""
        self._fail(err)
        self.release()  # a fatal error closes after the flush; until then what arrives is read and discarded

    def count_pub(self, topic, n):
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + n
        self.write(OK_FRAME)

    def on_rdy(self, cmd):
        self.rdy = cmd.count
        if self.channel is not None and self.ready_for_more():
            self.channel.wants_delivery()

    def ready_for_more(self):
        return self.in_flight < self.rdy and self.state == STATE_SUBSCRIBED and not self.closing_after_flush

    def on_fin(self, cmd):
        self.channel.finish_one(self, cmd.msg_id)

    def on_fin_batch(self, cmd):
        self.channel.finish_batch(self, cmd)

    def on_req(self, cmd):
        self.channel.requeue(self, cmd.msg_id, cmd.timeout_ms)

    def on_touch(self, cmd):
        self.channel.touch(self, cmd.msg_id)

    def on_cls(self, cmd):
        self.rdy = 0
        self.write(CLOSE_WAIT_FRAME)

    def on_nop(self, cmd):
        pass

    # ---- teardown --------------------------------------------------------------------------------------
    def detach(self):
        """Stop serving this connection without closing the socket (it is being handed to another worker)."""
        self.closed = True
        if self._hb_timer is not None:
            self._hb_timer.cancel()
        self.worker.pump.remove(self)
        self.worker.loop.forget(self.fd)
        self.worker.forget_session(self)

    def close(self):
        if self.closed:
            return
        self.closed = True
        if self._hb_timer is not None:
            self._hb_timer.cancel()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        if self.channel is not None:
            self.channel.remove_consumer(self)
        self.worker.pump.remove(self)
        self.worker.loop.forget(self.fd)
        self.worker.forget_session(self)
        try:
            self.sock.close()
        except OSError:
            pass


MIGRATED = object()  # returned by a SUB handler when the connection moved to the topic's owner
UPGRADED = object()  # returned by IDENTIFY when it granted TLS or compression: the relay takes the socket
AUTH_PENDING = object()  # returned by SUB/PUB/MPUB/DPUB while the auth server is asked again (TTL passed)

