"""`publish_partition`: a picklable callable for `df.foreachPartition` / `rdd.foreachPartition` (and the
data source writers) that publishes one partition's rows to an NSQ topic.

Theory of operation
-------------------
One Producer (one TCP connection) per partition. Rows are encoded (body.py) and cut into MPUBs of `batch`
rows; up to `window` MPUBs await nsqd's OK at once on that connection (pipelining doubles a single
connection's rate: benchmarks/results/client_bench.json). The nsqd list comes from `nsqd` and/or from each
lookupd's producers of the topic (all its nsqds when it has none yet), and is rotated by the partition id, so
partitions spread over the brokers; the Producer fails over along the list when a dial fails.

Error handling: an MPUB whose OK did not arrive (connection lost, timeout, nsqd busy with E_MPUB_FAILED) is
sent again, after `backoff` seconds doubling up to `max_backoff`, up to `retries` times, on a connection the
Producer re-dials (failing over to the next nsqd). A batch that no nsqd took after that raises `PublishError`,
which fails the Spark task, so Spark runs the task again (spark.task.maxFailures). An error nsqd marks fatal
for the data itself (E_BAD_TOPIC, E_BAD_MESSAGE) is raised at once: retrying cannot help.

Delivery: at least once. An MPUB that nsqd stored but whose OK was lost is published again, and a task that
Spark retries publishes its whole partition again; consumers that need exactly-once de-duplicate on a key.
"""

from __future__ import annotations

import collections
import random
import time
import urllib.error

from nsqpy.client import Producer
from nsqpy.client import lookupd as lookupd_http
from nsqpy.client.addresses import parse_address
from nsqpy.client.errors import ConnectionClosed, NoConnection, StoppedError
from nsqpy.protocol.errors import ProtocolError
from nsqpy.spark.body import BodyEncoder

__all__ = ["publish_partition", "PublishPartition", "PublishError", "split_addresses"]

# nsqd answered, but only "not now" (a full disk or /dev/shm): the same MPUB may succeed later or elsewhere.
RETRYABLE_CODES = {"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"}


class PublishError(RuntimeError):
    """No nsqd accepted a batch of rows: raised in the executor so that Spark fails (and retries) the task."""


def split_addresses(value) -> list[str]:
    """Comma-separated text (data source options, pynsq's style) or a list -> list of `host:port`."""
    if not value:
        return []
    if isinstance(value, str):
        value = value.split(",")
    return [str(v).strip() for v in value if str(v).strip()]


def _lookupd_nsqds(lookupds: list[str], topic: str, timeout: float) -> list[str]:
    found: list[str] = []
    errors = []
    for address in lookupds:
        try:
            producers = lookupd_http.lookup(address, topic, timeout)
            if not producers:   # nobody has the topic yet: any nsqd lookupd knows may create it
                base = address if "://" in address else "http://" + address
                producers = lookupd_http.parse_producers(
                    lookupd_http.http_get_json(base.rstrip("/") + "/nodes", timeout))
        except (OSError, urllib.error.URLError, ValueError) as err:
            errors.append(f"{address}: {err}")
            continue
        found += [f"{host}:{port}" for host, port in producers if f"{host}:{port}" not in found]
    if not found and errors:
        raise PublishError("no nsqd from lookupd: " + "; ".join(errors))
    return found


def _partition_id() -> int:
    try:
        from pyspark import TaskContext   # only inside a Spark task; plain callers get a random start
        context = TaskContext.get()
        if context is not None:
            return context.partitionId()
    except ImportError:
        pass
    return random.randrange(1 << 16)


class PublishPartition:
    """Call with an iterator of rows; returns how many rows were published. Picklable (plain options only):
    the Producer is made inside the call, on the executor."""

    def __init__(self, topic: str, nsqd=(), lookupd=(), *, batch: int = 500, column=None,
                 json_rows: bool = False, retries: int = 5, backoff: float = 0.1, max_backoff: float = 5.0,
                 window: int = 4, timeout: float = 30.0, connect_timeout: float = 10.0,
                 lookupd_timeout: float = 2.0, **client_options):
        self.topic = topic
        self.nsqd = split_addresses(nsqd)
        self.lookupd = split_addresses(lookupd)
        if not self.nsqd and not self.lookupd:
            raise ValueError("give nsqd and/or lookupd addresses")
        for address in self.nsqd:
            parse_address(address)                       # a typo fails on the driver, not in every task
        self.batch = max(1, int(batch))
        self.encoder = BodyEncoder(column, json_rows)
        self.retries, self.backoff, self.max_backoff = int(retries), float(backoff), float(max_backoff)
        self.window = max(1, int(window))
        self.timeout, self.connect_timeout = timeout, connect_timeout
        self.lookupd_timeout = lookupd_timeout
        self.client_options = client_options

    def addresses(self) -> list[str]:
        found = list(self.nsqd)
        if self.lookupd:
            found += [a for a in _lookupd_nsqds(self.lookupd, self.topic, self.lookupd_timeout) if a not in found]
        if not found:
            raise PublishError(f"no nsqd to publish topic {self.topic!r} to (lookupd lists none)")
        shift = _partition_id() % len(found)
        return found[shift:] + found[:shift]

    def __call__(self, rows) -> int:
        return self.publish_bodies(map(self.encoder.encode, rows))

    def publish_bodies(self, bodies) -> int:
        """Publish already-encoded bodies (bytes); returns how many. The writers' Arrow path enters here."""
        addresses = self.addresses()
        published = 0
        pending: collections.deque = collections.deque()   # (future, batch) in the order sent
        producer = Producer(addresses, timeout=self.timeout, connect_timeout=self.connect_timeout,
                            **self.client_options)
        try:
            for batch in _chunks(bodies, self.batch):
                pending.append((producer.mpub_async(self.topic, batch), batch))
                if len(pending) >= self.window:
                    published += self._settle(producer, *pending.popleft(), addresses)
            while pending:
                published += self._settle(producer, *pending.popleft(), addresses)
        finally:
            for future, _ in pending:       # an error above: nothing waits for these any more
                future.cancel()
            producer.close()
        return published

    def _settle(self, producer: Producer, future, bodies: list, addresses) -> int:
        """Wait for one pipelined MPUB; if it failed, send it again with back-off (see module docstring)."""
        try:
            future.result(self.timeout)
            return len(bodies)
        except Exception as err:   # noqa: BLE001  (sorted out by _retryable)
            self._check(err, bodies, addresses)
            last = err
        delay = self.backoff
        for _ in range(self.retries):
            time.sleep(delay)       # back-off before the next attempt, not synchronisation
            delay = min(delay * 2, self.max_backoff)
            try:
                producer.mpub(self.topic, bodies)
                return len(bodies)
            except Exception as err:   # noqa: BLE001
                self._check(err, bodies, addresses)
                last = err
        raise PublishError(f"nsq: {len(bodies)} rows for topic {self.topic!r} not accepted by any nsqd "
                           f"({', '.join(addresses)}) after {self.retries + 1} attempts: {last!r}") from last

    def _check(self, err: BaseException, bodies: list, addresses) -> None:
        """Return if `err` is worth another attempt; raise PublishError at once if not."""
        if isinstance(err, (ConnectionClosed, NoConnection, TimeoutError, OSError)):
            return
        if isinstance(err, ProtocolError) and err.code in RETRYABLE_CODES:
            return
        if isinstance(err, StoppedError):
            return
        raise PublishError(f"nsq: topic {self.topic!r} refused {len(bodies)} rows "
                           f"({', '.join(addresses)}): {err!r}") from err

    def __repr__(self) -> str:
        return f"publish_partition({self.topic!r}, nsqd={self.nsqd}, lookupd={self.lookupd}, batch={self.batch})"


def _chunks(items, size: int):
    chunk = []
    for item in items:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def publish_partition(topic: str, nsqd=(), lookupd=(), *, batch: int = 500, **options) -> PublishPartition:
    """A callable for ``df.foreachPartition(...)``: publishes each row of the partition to `topic`.

    `nsqd` / `lookupd`: lists or comma-separated `host:port` text. `batch`: rows per MPUB. Body: `column=`
    (name or index; binary/str), `json_rows=True` (the whole row as JSON), else the row itself (bytes/str, or
    a one-column row). `retries`, `backoff`, `max_backoff`: re-sends of a failed MPUB. Other keywords are
    Producer / Config options. Raises PublishError in the task when nothing accepted a batch.
    """
    return PublishPartition(topic, nsqd, lookupd, batch=batch, **options)
