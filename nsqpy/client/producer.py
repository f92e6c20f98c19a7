"""AsyncProducer: PUB, MPUB and DPUB over one reused connection, with fail-over and fail-back across nsqd
addresses.

Every publish waits for nsqd's reply, and any number of publishes may be in flight on the connection at once
(replies come back in order: see conn.py).

Theory of operation
-------------------
The addresses are in order of preference. The first publish dials them in turn and keeps the first connection
whose bootstrap succeeds; when none answers, rounds of dialling are repeated with exponential back-off (up to
`max_reconnect_interval`) until `connect_timeout` has passed, and `NoConnection` is raised.

A publish must get its reply within `write_timeout` of the previous reply on its connection (see conn.py): a
stopped or partitioned nsqd, or a closed connection, fails every publish waiting on that connection with
`ConnectionClosed`. Each of those publishes is then sent again, on a connection dialled starting from the next
address, until `connect_timeout` has passed since its first failure. A publish that ends with an error frame
(E_BAD_TOPIC, E_BAD_MESSAGE, ...) is not sent again: the data is wrong, not the link. A publish is therefore
acknowledged exactly once by some nsqd or raises; sending again after a lost reply means that nsqd may have
stored it too (NSQ's at-least-once).

Fail-back: while the connection is to a later address than the first, a background task dials the earlier
ones after 1 s, 2 s, 4 s, ... (capped at `max_reconnect_interval`, so a dead node is not hammered). When one
bootstraps, new publishes go to it and the old connection is closed once the publishes already sent on it
have their replies, so switching neither drops nor repeats a publish.

Topic names are checked before anything is sent (`InvalidName`, a ValueError, naming NSQ's rule).
"""

from __future__ import annotations

import asyncio
import logging
import time

from nsqpy.client.addresses import parse_address
from nsqpy.client.config import Config
from nsqpy.client.conn import Connection
from nsqpy.client.errors import (ClientError, ConnectionClosed, NoConnection, ProtocolError, StoppedError,
                                 check_name, describe)
from nsqpy.protocol import client as wire

__all__ = ["AsyncProducer", "MAX_BODY_SIZE", "failback_delays"]

log = logging.getLogger("nsqpy.client")
MAX_BODY_SIZE = 5 * 1024 * 1024   # nsqd's default --max-body-size: the MPUB batches are cut below it
FIRST_FAILBACK_PROBE = 1.0        # seconds after a fail-over before the preferred address is dialled again
_DIAL_ERRORS = (OSError, TimeoutError, ClientError, wire.FrameDecodeError)


def failback_delays(cap: float, first: float = FIRST_FAILBACK_PROBE):
    """The waits between fail-back probes: first, 2 x first, 4 x first, ... then `cap` for ever."""
    delay = min(first, cap)
    while True:
        yield delay
        delay = min(delay * 2, cap)


class AsyncProducer:
    def __init__(self, nsqd_tcp_addresses, config: Config | None = None, *, connect_timeout: float = 10.0,
                 max_body_size: int = MAX_BODY_SIZE, **options):
        if isinstance(nsqd_tcp_addresses, str):
            nsqd_tcp_addresses = [nsqd_tcp_addresses]
        self.addresses = [parse_address(a) for a in nsqd_tcp_addresses]
        if not self.addresses:
            raise ValueError("at least one nsqd address is needed")
        self.config = Config.build(config, **options)
        self.connect_timeout = connect_timeout
        self.max_body_size = max_body_size
        self._conn: Connection | None = None
        self._current = 0           # index of the connection's address (or where the next dial starts)
        self._lock: asyncio.Lock | None = None
        self._stopped = False
        self._stop_event = asyncio.Event()
        self._failback: asyncio.Task | None = None
        self._closing: set[asyncio.Task] = set()
        self._last_address: str | None = None

    @property
    def connection(self) -> Connection | None:
        return self._conn if self._conn is not None and not self._conn.closed else None

    async def connect(self, timeout: float | None = None) -> Connection:
        """The live connection, dialling (with fail-over and back-off, for `timeout` s, default connect_timeout;
        0: one round) if there is none."""
        conn = self.connection
        if conn is not None:
            return conn
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:        # one dialler; concurrent publishers wait for its connection
            if self._stopped:
                raise StoppedError("producer stopped")
            if self.connection is None:
                index, conn = await self._dial(self.connect_timeout if timeout is None else timeout)
                if self._stopped:
                    conn.close()
                    raise StoppedError("producer stopped")
                self._use(index, conn)
            return self._conn

    async def _open(self, index: int) -> Connection:
        host, port = self.addresses[index]
        conn = Connection(host, port, self.config)
        timeout = self.config.write_timeout if self.config.write_timeout > 0 else None
        await conn.connect(bootstrap_timeout=timeout)   # a stopped nsqd accepts TCP but never answers IDENTIFY
        conn.reply_timeout = timeout
        return conn

    async def _dial(self, timeout: float) -> tuple[int, Connection]:
        deadline = time.monotonic() + timeout
        delay = 0.05
        errors = []
        while True:
            for i in range(len(self.addresses)):
                if self._stopped:
                    raise StoppedError("producer stopped")
                index = (self._current + i) % len(self.addresses)
                try:
                    return index, await self._open(index)
                except _DIAL_ERRORS as err:
                    # this address is down or not speaking V2: try the next; an error frame (ProtocolError,
                    # e.g. IDENTIFY refused) is a configuration problem and is raised
                    errors.append("%s:%d: %s" % (*self.addresses[index], describe(err)))
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoConnection("no nsqd reachable: " + "; ".join(errors[-len(self.addresses):]))
            await self._pause(min(delay, left))   # back-off between rounds of dialling
            delay = min(delay * 2, self.config.max_reconnect_interval)

    def _use(self, index: int, conn: Connection) -> None:
        """Make `conn` (to address `index`) the one new publishes go to; the old one closes when idle."""
        old, self._conn = self._conn, conn
        if self._last_address not in (None, conn.address):
            log.info("producer: publishing to %s instead of %s", conn.address, self._last_address)
        self._last_address = conn.address
        self._current = index
        if old is not None and old is not conn:
            self._spawn_close(old)
        if index > 0 and (self._failback is None or self._failback.done()):
            self._failback = asyncio.get_running_loop().create_task(self._fail_back())

    def _spawn_close(self, conn: Connection) -> None:
        task = asyncio.get_running_loop().create_task(conn.close_when_idle())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _lost(self, conn: Connection) -> None:
        """`conn` failed: the next dial starts at the address after its own (each of its publishes calls this;
        only the first, while it is still the current connection, moves on). After an error frame nsqd closed
        the connection on purpose: its address is not at fault."""
        if conn is self._conn:
            self._conn = None
            if conn.fatal_error is None:
                self._current = (self._current + 1) % len(self.addresses)

    async def _fail_back(self) -> None:
        delays = failback_delays(self.config.max_reconnect_interval)
        while not self._stopped and self._current > 0:
            await self._pause(next(delays))
            for index in range(self._current):    # the addresses preferred to the current one, best first
                if self._stopped:
                    return
                try:
                    conn = await self._open(index)
                except (*_DIAL_ERRORS, ProtocolError) as err:
                    log.debug("producer: fail-back probe of %s:%d: %s", *self.addresses[index], describe(err))
                    continue
                async with self._lock:
                    if self._stopped or index >= self._current:
                        self._spawn_close(conn)   # stopped, or a dial meanwhile found this one or a better one
                    else:
                        self._use(index, conn)
                delays = failback_delays(self.config.max_reconnect_interval)
                break

    async def _pause(self, seconds: float) -> None:
        """Wait `seconds`, or less if close() is called (a back-off, not synchronisation)."""
        try:
            await asyncio.wait_for(self._stop_event.wait(), seconds)
        except TimeoutError:
            pass

    async def _command(self, data: bytes) -> bytes:
        first_failure = None
        while True:
            conn = await self.connect()
            try:
                return await conn.command(data)
            except ConnectionClosed as err:
                if self._stopped:
                    raise StoppedError(f"producer stopped ({err})") from err
                self._lost(conn)
                now = time.monotonic()
                first_failure = first_failure or now
                if now - first_failure > self.connect_timeout:
                    raise
                if conn.fatal_error is None:   # else the publish behind it raises the error: no news here
                    log.warning("producer: %s; publishing again", err)

    async def publish(self, topic: str, body: bytes) -> None:
        check_name("topic", topic)
        await self._command(wire.pub(topic, body))

    async def dpub(self, topic: str, delay: float, body: bytes) -> None:
        """Deferred publish: delivered `delay` seconds from now (DPUB takes ms)."""
        check_name("topic", topic)
        await self._command(wire.dpub(topic, int(delay * 1000), body))

    async def mpub(self, topic: str, bodies) -> None:
        """Publish many messages: one MPUB per batch that fits nsqd's max body size, all pipelined."""
        check_name("topic", topic)
        batches = list(split_batches(bodies, self.max_body_size))
        if len(batches) == 1:
            await self._command(wire.mpub(topic, batches[0]))
            return
        await asyncio.gather(*(self._command(wire.mpub(topic, b)) for b in batches))

    async def close(self) -> None:
        """Stop: dials and back-off waits end at once; publishes already sent get their replies (each within
        write_timeout), then the connection closes. Publishes still to be sent raise StoppedError."""
        self._stopped = True
        self._stop_event.set()
        if self._failback is not None:
            self._failback.cancel()
            await asyncio.gather(self._failback, return_exceptions=True)
        conn, self._conn = self._conn, None
        if conn is not None:
            self._spawn_close(conn)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)


def split_batches(bodies, max_body_size: int):
    """Cut `bodies` into lists whose MPUB body (4 + sum of 4 + len) stays within max_body_size."""
    batch, size = [], 4
    for body in bodies:
        need = 4 + len(body)
        if batch and size + need > max_body_size:
            yield batch
            batch, size = [], 4
        batch.append(body)
        size += need
    if batch:
        yield batch
    elif size == 4 and not batch:
        raise ValueError("mpub needs at least one message")
