"""nsqlookupd's registration database: (category, key, subkey) -> the producers (nsqd nodes) registered there.

Categories are NSQ's: ``client`` ("", "": every identified nsqd), ``topic`` (topic, "") and ``channel`` (topic,
channel). A registration may exist with no producers (created over HTTP, or left behind when its last producer
went: NSQ never removes a key when a producer leaves, except for ephemeral names on UNREGISTER), which is why
``/topics`` still lists a topic whose nsqd disconnected until someone deletes it.

Producers are keyed by their peer id (the connection's remote address). One ``PeerInfo`` is shared by every
registration of a connection, so a PING refreshes the producer everywhere at once; tombstones belong to a
(registration, producer) pair, as in NSQ where each registration holds its own ``Producer``.

Lookups take NSQ's wildcard ``*`` for key or subkey (``find_registrations("channel", topic, "*")``), with the same
meaning (a literal ``*`` sent over HTTP matches everything, as in nsqlookupd). Two indexes keep the common cases
off a full scan: the channel registrations of each topic, and the registrations of each peer (for disconnects and
``/nodes``). Results come sorted (NSQ's order is Go's random map order, so any order is compatible; sorted is
stable for tests and diffs).

Times are ``time.time_ns()`` (``/debug`` reports them in ns), limits are ns as the options hold them. The database
is plain Python owned by one process (``nsqpy/lookupd/registry.py``): no locks.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Registration", "PeerInfo", "Producer", "RegistrationDB", "GO_ZERO_TIME_NS"]

# Go's time.Time{}.UnixNano(): what /debug shows as tombstoned_at for a producer never tombstoned.
GO_ZERO_TIME_NS = -6795364578871345152
ANY = "*"


class Registration(NamedTuple):
    category: str
    key: str
    subkey: str

    def matches(self, category: str, key: str, subkey: str) -> bool:
        return (category == self.category and (key == ANY or key == self.key)
                and (subkey == ANY or subkey == self.subkey))


@dataclass(eq=False, slots=True)
class PeerInfo:
    id: str                      # the connection's remote address
    remote_address: str
    hostname: str
    broadcast_address: str
    tcp_port: int
    http_port: int
    version: str
    last_update: int = field(default_factory=time.time_ns)


@dataclass(eq=False, slots=True)
class Producer:
    peer: PeerInfo
    tombstoned: bool = False
    tombstoned_at: int = GO_ZERO_TIME_NS

    def tombstone(self, now: int | None = None) -> None:
        self.tombstoned = True
        self.tombstoned_at = time.time_ns() if now is None else now

    def is_tombstoned(self, lifetime: int, now: int) -> bool:
        return self.tombstoned and now - self.tombstoned_at < lifetime


class RegistrationDB:
    def __init__(self):
        self.map: dict[Registration, dict[str, Producer]] = {}
        self._channels: dict[str, set[Registration]] = {}   # topic -> its "channel" registrations
        self._by_peer: dict[str, set[Registration]] = {}    # peer id -> registrations holding it

    # ---- changes ---------------------------------------------------------------------------------------
    def add_registration(self, k: Registration) -> dict[str, Producer]:
        producers = self.map.get(k)
        if producers is None:
            producers = self.map[k] = {}
            if k.category == "channel":
                self._channels.setdefault(k.key, set()).add(k)
        return producers

    def add_producer(self, k: Registration, p: Producer) -> bool:
        """True if the producer was not registered there yet (a repeated REGISTER changes nothing)."""
        producers = self.add_registration(k)
        if p.peer.id in producers:
            return False
        producers[p.peer.id] = p
        self._by_peer.setdefault(p.peer.id, set()).add(k)
        return True

    def remove_producer(self, k: Registration, peer_id: str) -> tuple[bool, int]:
        """-> (was it there, producers left). The key stays, even when empty (as NSQ's)."""
        producers = self.map.get(k)
        if producers is None:
            return False, 0
        removed = producers.pop(peer_id, None) is not None
        if removed:
            self._unindex_peer(peer_id, k)
        return removed, len(producers)

    def remove_registration(self, k: Registration) -> None:
        producers = self.map.pop(k, None)
        if producers is None:
            return
        for peer_id in producers:
            self._unindex_peer(peer_id, k)
        if k.category == "channel":
            chans = self._channels.get(k.key)
            if chans is not None:
                chans.discard(k)
                if not chans:
                    del self._channels[k.key]

    def _unindex_peer(self, peer_id: str, k: Registration) -> None:
        regs = self._by_peer.get(peer_id)
        if regs is not None:
            regs.discard(k)
            if not regs:
                del self._by_peer[peer_id]

    # ---- queries ---------------------------------------------------------------------------------------
    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        if key != ANY and subkey != ANY:
            k = Registration(category, key, subkey)
            return [k] if k in self.map else []
        if category == "channel" and key != ANY:
            candidates = self._channels.get(key, ())
        else:
            candidates = self.map
        return sorted(k for k in candidates if k.matches(category, key, subkey))

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        if key != ANY and subkey != ANY:
            return list(self.map.get(Registration(category, key, subkey), {}).values())
        seen: dict[str, Producer] = {}
        for k in self.find_registrations(category, key, subkey):
            for peer_id, p in self.map[k].items():
                seen.setdefault(peer_id, p)
        return list(seen.values())

    def lookup_registrations(self, peer_id: str) -> list[Registration]:
        return sorted(self._by_peer.get(peer_id, ()))

    def producer(self, k: Registration, peer_id: str) -> Producer | None:
        return self.map.get(k, {}).get(peer_id)


def filter_by_active(producers, inactivity_timeout: int, tombstone_lifetime: int, now: int | None = None):
    """Producers whose last PING (or IDENTIFY) is within the timeout and which are not tombstoned (NSQ's
    ``FilterByActive``; a lifetime of 0 keeps tombstoned ones)."""
    now = time.time_ns() if now is None else now
    return [p for p in producers
            if now - p.peer.last_update <= inactivity_timeout and not p.is_tombstoned(tombstone_lifetime, now)]
