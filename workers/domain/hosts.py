"""What Channel, Topic and Session use of the worker that hosts them: one ``typing.Protocol`` each, naming every
worker service the class calls or reads, and nothing more.

Theory of operation: a domain object is handed its host at construction (``Topic(host, ...)``, ``Session(host,
...)``; a Channel reaches it through its topic, ``ChannelParent.worker``). The real host is
``nsqpy.workers.processes.worker.Worker``; a unit test passes a small fake (``tests/workers/fakes.py``) that
implements the same Protocol. Nothing here runs: the Protocols are read by type checkers and by
``tests/workers/test_hosts.py``, which checks, without starting a broker, that the real Worker class (and the real
classes of the parts named here: the pump, the loop, the suspect words, the topic journal, the control block,
the stats publisher, the options) provides every member each Protocol names, so the interface cannot drift
silently. A member a class stops using leaves its Protocol in the same change; one it starts using joins it.

The parts a host hands out are Protocols of their own (``SessionPump``, ``SessionLoop``, ...): what the domain
object uses of them, not their whole surface. The in-flight table and the deferred store are the real classes
(``nsqpy.ipc.inflight.InFlightTable``, ``workers/domain/deferred.py``): fakes use real ones in local memory.

At run time this module imports only ``typing``; the concrete types it names (under ``TYPE_CHECKING``) are of
lower modules (``nsqpy.ipc``, ``nsqpy.protocol``, ``workers/domain/deferred.py``), none of which imports a domain
object, so importing it adds no circle.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # pragma: no cover (types only)
    import numpy as np

    from nsqpy.ipc.inflight import InFlightTable
    from nsqpy.protocol.identify import ServerSettings
    from nsqpy.protocol.v2_parser import Limits
    from nsqpy.workers.domain.deferred import DeferredStore


# ---- parts a host hands out ------------------------------------------------------------------------------
class SuspectWords(Protocol):
    """The poison-record words of the worker (``workers/storage/poison.py``'s ``Suspect``): a delivery round names
    what it frames, and a channel a worker died delivering goes one message per round."""
    w: np.ndarray
    base: int

    def careful_rounds(self, key: int) -> int: ...

    def careful_done(self) -> None: ...

    def begin(self, kind: int, topic: int, key: int, pos: int, count: int) -> None: ...

    def end(self) -> None: ...


class ChannelJournal(Protocol):
    """What a channel records in the worker's topic journal (``workers/storage/topic_journal.py``)."""

    def channel_paused(self, key: int, paused: bool) -> None: ...


class TopicJournal(ChannelJournal, Protocol):
    """What a topic records in the worker's topic journal."""

    def channel_created(self, topic_index: int, name: str, ch: int, key: int) -> None: ...

    def channel_deleted(self, key: int) -> None: ...

    def topic_paused(self, index: int, paused: bool) -> None: ...


class TopicFullMarks(Protocol):
    """The control block's full marks (``workers/control/block.py``): other workers refuse a full topic's
    publishes at once (and a bounded channel's, or hold them back: ``set_topic_mark``, workers/domain/bounds.py)."""

    def topic_full(self, w: int, crc: int) -> bool: ...

    def set_topic_full(self, w: int, crc: int, full: bool) -> None: ...

    def set_topic_mark(self, w: int, crc: int, kind: Any, channel: str = "", limit: int = 0,
                       value: int = 0) -> None: ...


class TopicStats(Protocol):
    """The worker's side of the stats plane (``workers/domain/stats_rows.py``)."""
    changed: set

    def structure_changed(self, name: str) -> None: ...


class ChannelOptions(Protocol):
    """The nsqd options a channel reads (``e2e_processing_latency_*`` too when present: ``workers/domain/e2e.py``)."""
    max_msg_timeout: int


class TopicOptions(ChannelOptions, Protocol):
    """The nsqd options a topic reads."""
    node_id: int
    max_msg_size: int
    mem_queue_size: int
    max_disk_bytes_per_topic: int


class SessionPump(Protocol):
    """What a session uses of the worker's pump (``workers/lane/pump.py``): it reads the session's socket, and
    these per-fd arrays say what it may do for it (``clean``: handle its next lone PUB; ``busy``: output is
    queued, so no OK of the pump's may overtake it; ``last_read``: time.monotonic() of its last recv)."""
    busy: np.ndarray
    clean: np.ndarray
    last_read: np.ndarray

    def add(self, session: Any, now: float) -> None: ...

    def remove(self, session: Any) -> None: ...

    def pause(self, fd: int) -> None: ...

    def resume(self, fd: int) -> None: ...


class SessionLoop(Protocol):
    """What a session uses of the worker's event loop (``workers/processes/event_loop.py``)."""

    def add_writer(self, fd: int, callback: Any) -> None: ...

    def remove_writer(self, fd: int) -> None: ...

    def forget(self, fd: int) -> None: ...

    def call_later(self, delay: float, callback: Any) -> Any: ...


class Log(Protocol):
    """The worker's logger (``nsqpy/log.py``): the levels a session writes at (AUTH's warning included)."""

    def debug(self, msg: str) -> None: ...

    def info(self, msg: str) -> None: ...

    def warn(self, msg: str) -> None: ...


# ---- the hosts -------------------------------------------------------------------------------------------
class ChannelHost(Protocol):
    """Every worker service a ``Channel`` uses (``workers/domain/channel.py``)."""
    opts: ChannelOptions
    inflight: InFlightTable
    deferred: DeferredStore
    directory: ChannelJournal
    suspect: SuspectWords
    pending: set            # channels that want a delivery pass
    table_blocked: set      # channels a full in-flight table stopped
    touched: set            # topics whose low-water marks may have moved
    round_buffer: np.ndarray | None  # a compiled round's frames; None: no compiled rounds (--crash-on-body)
    log: Log                # a refused dead-letter publish's line
    stopping: bool          # a clean stop (or a salvage) began: dead letters wait in their slots, saved

    def dead_letter(self, topic: str, src: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> Any:
        """Publish dead letters (``workers/domain/dead_letter.py``) to ``topic`` through the worker's one publish
        decision (``Forwarder.commit``) -> True (committed), False (refused: the topic is full or cannot store
        them) or a ``Parked`` publish (the ring to the topic's owner has no room now)."""
        ...

    def write_frames(self, s: Any, log: Any, positions: np.ndarray, attempts: np.ndarray) -> None: ...

    def send_frames(self, s: Any, out: np.ndarray, end: int, sent: int = 0) -> None: ...

    def direct_fd(self, s: Any) -> int: ...

    def timer_start(self, slots: np.ndarray, key: int) -> None: ...

    def timer_start_each(self, slots: Any, keys: Any) -> None: ...

    def timer_leave(self, slots: np.ndarray) -> None: ...

    def timer_leave_one(self, slot: int) -> None: ...

    def channel_changed(self, ch: Any) -> None: ...

    def deferred_changed(self) -> None: ...

    def retry_later(self, ch: Any) -> None: ...

    def slots_of_channel(self, key: int) -> list: ...

    def storage_failed(self, what: str, exc: BaseException) -> None: ...

    def _record(self, change: Any, *args: Any) -> None: ...


class ChannelParent(Protocol):
    """What a ``Channel`` uses of its topic (a ``Topic``, or a unit test's fake): its host is the topic's."""
    worker: ChannelHost
    log: Any                # nsqpy.ipc.msglog.MessageLog
    index: int
    name: str
    paused: bool

    def delete_channel(self, name: str) -> None: ...


class TopicHost(ChannelHost, Protocol):
    """Every worker service a ``Topic`` uses (``workers/domain/topic.py``), and its channels' (``ChannelHost``:
    a channel's host is its topic's)."""
    opts: TopicOptions
    directory: TopicJournal
    control: TopicFullMarks
    stats: TopicStats
    index: int
    data_path: str
    channels_by_key: dict
    storage_failing: bool

    def next_channel_key(self) -> int: ...

    def channel_policy(self, topic: str, channel: str) -> Any: ...   # a new channel's Policy (domain/policy.py)

    def delete_topic(self, name: str) -> None: ...

    def refresh_low_water(self, topics: list) -> None: ...

    def storage_works(self) -> None: ...

    def appended(self, topic: Any, n: int) -> None: ...

    def watch_limits(self, topic: Any) -> None: ...   # a channel mark to clear once the channel drains (bounds.py)


class SessionHost(Protocol):
    """Every worker service a ``Session`` uses (``workers/domain/session.py``, with its AUTH mixin
    ``workers/connections/auth.py`` and the TLS/compression upgrade ``workers/connections/transport.py``)."""
    opts: Any               # NsqdOptions: the auth client and the TLS context read theirs
    limits: Limits
    server_settings: ServerSettings
    log: Log
    loop: SessionLoop
    pump: SessionPump
    dirty: list             # sessions with output, flushed once per loop iteration

    def subscribe(self, s: Any, topic: str, channel: str) -> Any: ...

    def publish(self, s: Any, topic: str, bodies: list, defer_ms: int, verb: str) -> None: ...

    def publish_mpub(self, s: Any, cmd: Any) -> None: ...

    def migrate(self, s: Any, sub: Any, rest: bytes) -> None: ...

    def forget_session(self, s: Any) -> None: ...
