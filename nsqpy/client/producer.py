"""AsyncProducer: PUB, MPUB and DPUB over one reused connection, with fail-over across nsqd addresses.

Every publish waits for nsqd's reply, and any number of publishes may be in flight on the connection at once
(replies come back in order: see conn.py). When the connection is lost, the publishes waiting on it fail with
`ConnectionClosed` (nsqd may or may not have stored them: the caller decides whether to publish again); the
next publish dials again, trying each address in turn from the one that last worked, and backs off
exponentially (up to `max_reconnect_interval`) between rounds until `connect_timeout` has passed.
"""

from __future__ import annotations

import asyncio
import logging
import time

from nsqpy.client.config import Config
from nsqpy.client.conn import Connection
from nsqpy.client.errors import ClientError, NoConnection, StoppedError
from nsqpy.client.addresses import parse_address
from nsqpy.protocol import client as wire

__all__ = ["AsyncProducer", "MAX_BODY_SIZE"]

log = logging.getLogger("nsqpy.client")
MAX_BODY_SIZE = 5 * 1024 * 1024   # nsqd's default --max-body-size: the MPUB batches are cut below it


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
        self._current = 0
        self._lock: asyncio.Lock | None = None
        self._stopped = False

    @property
    def connection(self) -> Connection | None:
        return self._conn if self._conn is not None and not self._conn.closed else None

    async def connect(self) -> Connection:
        """The live connection, dialling (with fail-over and back-off) if there is none."""
        conn = self.connection
        if conn is not None:
            return conn
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:        # one dialler; concurrent publishers wait for its connection
            if self._stopped:
                raise StoppedError("producer stopped")
            if self.connection is None:
                self._conn = await self._dial()
            return self._conn

    async def _dial(self) -> Connection:
        deadline = time.monotonic() + self.connect_timeout
        delay = 0.05
        errors = []
        while True:
            for i in range(len(self.addresses)):
                index = (self._current + i) % len(self.addresses)
                host, port = self.addresses[index]
                try:
                    conn = await Connection(host, port, self.config).connect()
                except (OSError, TimeoutError, ClientError, wire.FrameDecodeError) as err:
                    # this address is down or not speaking V2: try the next; an error frame (ProtocolError,
                    # e.g. IDENTIFY refused) is a configuration problem and is raised
                    errors.append(f"{host}:{port}: {err or type(err).__name__}")
                    continue
                if index != self._current:
                    log.info("producer: failed over to %s:%d", host, port)
                self._current = index
                return conn
            left = deadline - time.monotonic()
            if left <= 0:
                raise NoConnection("no nsqd reachable: " + "; ".join(errors[-len(self.addresses):]))
            await asyncio.sleep(min(delay, left))   # back-off between rounds of dialling, not synchronisation
            delay = min(delay * 2, self.config.max_reconnect_interval)

    async def _command(self, data: bytes) -> bytes:
        conn = await self.connect()
        return await conn.command(data)

    async def publish(self, topic: str, body: bytes) -> None:
        await self._command(wire.pub(topic, body))

    async def dpub(self, topic: str, delay: float, body: bytes) -> None:
        """Deferred publish: delivered `delay` seconds from now (DPUB takes ms)."""
        await self._command(wire.dpub(topic, int(delay * 1000), body))

    async def mpub(self, topic: str, bodies) -> None:
        """Publish many messages: one MPUB per batch that fits nsqd's max body size, all pipelined."""
        batches = list(split_batches(bodies, self.max_body_size))
        if len(batches) == 1:
            await self._command(wire.mpub(topic, batches[0]))
            return
        conn = await self.connect()
        await asyncio.gather(*(conn.command(wire.mpub(topic, b)) for b in batches))

    async def close(self) -> None:
        self._stopped = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()


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
