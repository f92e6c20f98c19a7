"""nsqd's plain-text /stats (its printStats): what an operator's ``curl host:4151/stats`` shows.

Same lines and column widths as nsqd 1.3.0, from the same dict ``/stats?format=json`` returns, so the two never
disagree. Pure functions: a stats dict in, text out.
"""
from __future__ import annotations

import time

__all__ = ["stats_text", "go_duration", "rfc3339", "nanoseconds_to_human", "policy_line"]

_MEMORY_KEYS = ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes", "gc_pause_usec_100",
                "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes", "gc_total_runs")


def go_duration(seconds: float) -> str:
    """Go's time.Duration.String(), e.g. 1h2m3.5s, 4.2ms, 0s."""
    ns = int(round(seconds * 1e9))
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_trim(ns / 1e3)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{_trim(ns / 1e6)}ms"
    h, rest = divmod(ns, 3_600_000_000_000)
    m, rest = divmod(rest, 60_000_000_000)
    secs = _trim(rest / 1e9) if rest else "0"
    out = f"{h}h{m}m" if h else (f"{m}m" if m else "")
    return f"{sign}{out}{secs}s"


def _trim(x: float) -> str:
    return f"{x:.9f}".rstrip("0").rstrip(".")


def rfc3339(unix: int) -> str:
    """Go's time.RFC3339 of a local time: 2006-01-02T15:04:05Z07:00."""
    t = time.localtime(unix)
    off = t.tm_gmtoff or 0
    if off == 0:
        zone = "Z"
    else:
        zone = f"{'+' if off > 0 else '-'}{abs(off) // 3600:02d}:{abs(off) % 3600 // 60:02d}"
    return time.strftime("%Y-%m-%dT%H:%M:%S", t) + zone


def nanoseconds_to_human(v: float) -> str:
    """nsqd's stringy.NanoSecondToHuman: one decimal and the largest unit the value exceeds (5.0ms, 1.2s, 800.0ns)."""
    for scale, suffix in ((1e9, "s"), (1e6, "ms"), (1e3, "us")):
        if v > scale:
            return f"{v / scale:.1f}{suffix}"
    return f"{v:.1f}ns"


def _e2e(e2e) -> str:
    """quantile.Result.String(): each percentile's value, human-readable, comma-separated ("" when none)."""
    items = (e2e or {}).get("percentiles") or []
    return ", ".join(nanoseconds_to_human(item.get("value", 0)) for item in items)


def client_line(c: dict, now: float) -> str:
    """ClientV2Stats.String(): producers show their pub counts, consumers their delivery counters."""
    connected = go_duration(int(now - c.get("connect_ts", now)))
    port = c.get("remote_address", "").rpartition(":")[2]
    ident = f"{c.get('hostname', '')}:{port} {c.get('user_agent', '')}"
    pubs = c.get("pub_counts")
    if pubs:
        total = sum(p["count"] for p in pubs)
        topics = ",".join(f"{p['topic']}={p['count']}" for p in pubs)
        return f"[{c.get('version', 'V2')} {ident:<21}] msgs: {total:<8} topics: {topics} connected: {connected}"
    return (f"[{c.get('version', 'V2')} {ident:<21}] state: {c['state']} inflt: {c['in_flight_count']:<4} "
            f"rdy: {c['ready_count']:<4} fin: {c['finish_count']:<8} re-q: {c['requeue_count']:<8} "
            f"msgs: {c['message_count']:<8} connected: {connected}")


def policy_line(c: dict) -> str:
    """nsqpy's policies of a channel (a line of its own under the channel's, only for a channel that has a policy
    or counted a drop, so a broker without policies prints nsqd's text): the counters, then the effective values
    that are on."""
    line = (f"policy: dead-lettered: {c['dead_lettered_count']:<5} expired: {c['expired_count']:<5} "
            f"dropped: {c['dropped_count']:<5}")
    p = c.get("policy")
    if not p:
        return line + " (off)"
    on = [f"max-attempts={p['max_attempts']}" if p["max_attempts"] else "",
          f"dead-letter={p['dead_letter_topic']}" if p["dead_letter_topic"] else "",
          f"ttl={go_duration(p['message_ttl_ms'] / 1000)}" if p["message_ttl_ms"] else "",
          f"max-depth={p['max_depth']}" if p["max_depth"] else "",
          f"max-bytes={p['max_bytes']}" if p["max_bytes"] else "",
          f"overflow={p['overflow']}" if p["max_depth"] or p["max_bytes"] else ""]
    return line + " " + " ".join(x for x in on if x)


def stats_text(stats: dict, version_line: str, now: float | None = None) -> str:
    now = time.time() if now is None else now
    start = stats.get("start_time", 0)
    out = [f"{version_line}\n", f"start_time {rfc3339(start)}\n", f"uptime {go_duration(max(0, now - start))}\n",
           f"\nHealth: {stats.get('health', 'OK')}\n"]
    memory = stats.get("memory")
    if memory is not None:
        out.append("\nMemory:\n")
        out.extend(f"   {key:<25}\t{memory.get(key, 0)}\n" for key in _MEMORY_KEYS)
    topics = stats.get("topics") or []
    out.append("\nTopics:" if topics else "\nTopics: None\n")
    for t in topics:
        mark = "*P " if t["paused"] else "   "
        out.append(f"\n{mark}[{t['topic_name']:<15}] depth: {t['depth']:<5} be-depth: {t['backend_depth']:<5} "
                   f"msgs: {t['message_count']:<8} e2e%: {_e2e(t.get('e2e_processing_latency'))}\n")
        for c in t["channels"]:
            mark = "   *P " if c["paused"] else "      "
            out.append(f"{mark}[{c['channel_name']:<25}] depth: {c['depth']:<5} be-depth: {c['backend_depth']:<5} "
                       f"inflt: {c['in_flight_count']:<4} def: {c['deferred_count']:<4} "
                       f"re-q: {c['requeue_count']:<5} timeout: {c['timeout_count']:<5} "
                       f"msgs: {c['message_count']:<8} e2e%: {_e2e(c.get('e2e_processing_latency'))}\n")
            if "dropped_count" in c:
                out.append(f"          {policy_line(c)}\n")
            out.extend(f"        {client_line(k, now)}\n" for k in c.get("clients") or ())
    producers = stats.get("producers") or []
    if not producers:
        out.append("\nProducers: None\n")
    else:
        out.append("\nProducers:\n")
        out.extend(f"   {client_line(p, now)}\n" for p in producers)
    return "".join(out)
