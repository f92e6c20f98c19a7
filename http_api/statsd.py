"""nsqd's statsd push (its statsdLoop, spec 12): every --statsd-interval, one UDP burst of NSQ's metric names.

    <prefix>topic.<t>.message_count:<delta>|c     counters are deltas since the last push
    <prefix>topic.<t>.depth:<n>|g                 gauges are values
    <prefix>topic.<t>.channel.<c>.clients:<n>|g   ... and the others of statsd_lines()
    <prefix>mem.heap_in_use_bytes:<n>|g           with --statsd-mem-stats (nsqpy: the workers' RSS)

The prefix is --statsd-prefix with ``%s`` replaced by ``<broadcast address>_<http port>`` (``.`` and ``:`` as
``_``) and a trailing ``.`` added, as nsqd does. Lines are packed into datagrams of at most
--statsd-udp-packet-size bytes without splitting a line (nsqd's BoundaryBufferedWriter), and the datagrams are
spread over the interval less one second (its SpreadWriter), so a statsd daemon never gets one large burst.

``statsd_lines`` and ``packets`` are pure; ``StatsdPusher`` runs in one process of its own (workers/processes/http.py).
"""
from __future__ import annotations

import socket
import time

__all__ = ["statsd_prefix", "statsd_lines", "packets", "StatsdPusher"]

_MEM = ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes", "gc_pause_usec_100",
        "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes")


def statsd_prefix(template: str, broadcast_address: str, http_port: int) -> str:
    if not template:
        return ""
    host = f"[{broadcast_address}]:{http_port}" if ":" in broadcast_address else f"{broadcast_address}:{http_port}"
    key = host.replace(".", "_").replace(":", "_")  # statsd.HostKey
    prefix = template.replace("%s", key)
    return prefix if prefix.endswith(".") else prefix + "."


def _by_name(items, key):
    return {i[key]: i for i in items or ()}


POLICY_COUNTS = ("dead_lettered_count", "expired_count", "dropped_count")


def statsd_lines(stats: dict, last: dict | None, prefix: str, exclude_ephemeral=False, mem=True,
                 last_gc_runs=0) -> list:
    """The lines of one push, from this snapshot and the last one (for the counters' deltas)."""
    out = []
    old_topics = _by_name((last or {}).get("topics"), "topic_name")

    def count(stat, value, old):
        out.append(f"{prefix}{stat}:{value - old}|c")

    def gauge(stat, value):
        out.append(f"{prefix}{stat}:{int(value)}|g")

    for t in stats.get("topics") or ():
        name = t["topic_name"]
        if exclude_ephemeral and name.endswith("#ephemeral"):
            continue
        old = old_topics.get(name, {})
        count(f"topic.{name}.message_count", t["message_count"], old.get("message_count", 0))
        count(f"topic.{name}.message_bytes", t["message_bytes"], old.get("message_bytes", 0))
        gauge(f"topic.{name}.depth", t["depth"])
        gauge(f"topic.{name}.backend_depth", t["backend_depth"])
        for item in (t.get("e2e_processing_latency") or {}).get("percentiles") or ():
            gauge(f"topic.{name}.e2e_processing_latency_{item['quantile'] * 100:.0f}", item.get("value", 0))
        old_channels = _by_name(old.get("channels"), "channel_name")
        for c in t["channels"]:
            cname = c["channel_name"]
            if exclude_ephemeral and cname.endswith("#ephemeral"):
                continue
            oc = old_channels.get(cname, {})
            base = f"topic.{name}.channel.{cname}"
            count(f"{base}.message_count", c["message_count"], oc.get("message_count", 0))
            gauge(f"{base}.depth", c["depth"])
            gauge(f"{base}.backend_depth", c["backend_depth"])
            gauge(f"{base}.in_flight_count", c["in_flight_count"])
            gauge(f"{base}.deferred_count", c["deferred_count"])
            count(f"{base}.requeue_count", c["requeue_count"], oc.get("requeue_count", 0))
            count(f"{base}.timeout_count", c["timeout_count"], oc.get("timeout_count", 0))
            gauge(f"{base}.clients", c["client_count"])
            if "dropped_count" in c:  # nsqpy's policies (only on channels that have one or counted anything)
                for key in POLICY_COUNTS:
                    count(f"{base}.{key}", c[key], oc.get(key, 0))
            for item in (c.get("e2e_processing_latency") or {}).get("percentiles") or ():
                gauge(f"{base}.e2e_processing_latency_{item['quantile'] * 100:.0f}", item.get("value", 0))
    memory = stats.get("memory")
    if mem and memory is not None:
        for key in _MEM:
            gauge(f"mem.{key}", memory.get(key, 0))
        count("mem.gc_runs", memory.get("gc_total_runs", 0), last_gc_runs)
    return out


def packets(lines: list, size: int) -> list:
    """Lines joined with newlines into datagrams of at most ``size`` bytes; a longer line goes alone."""
    out, buf = [], b""
    for line in lines:
        raw = line.encode() + b"\n"
        if buf and len(buf) + len(raw) > size:
            out.append(buf)
            buf = b""
        buf += raw
    if buf:
        out.append(buf)
    return out


class StatsdPusher:
    """Pushes every interval until the process is stopped (its own process: a sleep is its whole loop)."""

    def __init__(self, reader, opts, http_port, log):
        self.reader = reader
        self.opts = opts
        self.log = log
        self.prefix = statsd_prefix(opts.statsd_prefix, opts.broadcast_address,
                                    opts.broadcast_http_port or http_port)
        self.interval = max(0.1, opts.statsd_interval / 1e9)  # nsqd's ticker refuses 0; no busy loop here
        self.last = None
        self.last_gc_runs = 0

    def push_once(self, spread: float = 0.0) -> int:
        """One push; -> datagrams sent. ``spread``: seconds to spread them over."""
        addr = self.opts.statsd_address
        host, _, port = addr.rpartition(":")
        stats = self.reader.stats(include_clients=False, include_mem=self.opts.statsd_mem_stats)
        lines = statsd_lines(stats, self.last, self.prefix, self.opts.statsd_exclude_ephemeral,
                             self.opts.statsd_mem_stats, self.last_gc_runs)
        self.last = stats
        if stats.get("memory") is not None:
            self.last_gc_runs = stats["memory"].get("gc_total_runs", 0)
        datagrams = packets(lines, self.opts.statsd_udp_packet_size)
        try:
            sock = socket.socket(socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET, socket.SOCK_DGRAM)
            sock.connect((host.strip("[]"), int(port)))
        except (OSError, ValueError):
            self.log.error(f"failed to create UDP socket to statsd({addr})")
            return 0
        self.log.info(f"STATSD: pushing stats to {addr}")
        gap = spread / len(datagrams) if datagrams else 0
        with sock:
            for d in datagrams:
                try:
                    sock.send(d)
                except OSError:
                    pass  # nobody listening (ICMP refused): statsd is best effort, as in nsqd
                if gap:
                    time.sleep(gap)  # spreading the burst over the interval is the point here
        return len(datagrams)

    def run(self):
        next_at = time.monotonic() + self.interval
        while True:
            time.sleep(max(0.0, next_at - time.monotonic()))
            next_at += self.interval
            self.push_once(spread=max(0.0, self.interval - 1.0))
