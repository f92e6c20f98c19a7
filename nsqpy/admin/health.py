"""The cluster health strip: what successive samples of every node's /stats say is wrong.

    tracker = HealthTracker()
    findings = tracker.observe(now, producers, answers)   # answers: {node: /stats doc, or the error text}

Findings (each a list of small dicts, shown on every page and served at /api/health):

* ``down``: nodes that did not answer, and nodes seen before that no nsqlookupd lists any more (a stopped nsqd
  unregisters, so lookupd alone would make it vanish; Go's UI then shows totals a third smaller with no word).
  A node is remembered for ``FORGET_AFTER`` seconds after it was last seen.
* ``restarted``: nodes whose start_time changed or whose counters (a topic's or channel's message_count) went
  backwards between two samples; shown for ``RESTART_SHOWN`` seconds.
* ``growing``: channels (per node) whose depth rose in each of the last ``GROWING_SAMPLES`` samples.
* ``stuck``: clients with RDY > 0 and nothing in flight whose channel has messages waiting (and is not paused)
  and whose message count did not move since the previous sample.

The tracker is a pure object over the samples it is given (no I/O, no clock of its own), so tests feed it
hand-made samples; nsqadmin's app keeps one and samples the cluster at most every ``SAMPLE_EVERY`` seconds.
"""
from __future__ import annotations

from collections import deque

__all__ = ["HealthTracker", "FORGET_AFTER", "GROWING_SAMPLES", "RESTART_SHOWN", "SAMPLE_EVERY"]

FORGET_AFTER = 3600.0
GROWING_SAMPLES = 3
RESTART_SHOWN = 60.0
SAMPLE_EVERY = 2.0


def _counts(doc: dict) -> dict:
    """{(topic, channel or ""): message_count} of one /stats doc."""
    out = {}
    for t in doc.get("topics") or ():
        out[(t.get("topic_name", ""), "")] = int(t.get("message_count", 0))
        for c in t.get("channels") or ():
            out[(t.get("topic_name", ""), c.get("channel_name", ""))] = int(c.get("message_count", 0))
    return out


class HealthTracker:
    def __init__(self, growing_samples: int = GROWING_SAMPLES, forget_after: float = FORGET_AFTER,
                 restart_shown: float = RESTART_SHOWN):
        self.growing_samples = growing_samples
        self.forget_after = forget_after
        self.restart_shown = restart_shown
        self.known: dict[str, tuple[str, float]] = {}          # node -> (hostname, last seen)
        self._last: dict[str, dict] = {}                        # node -> its previous /stats doc
        self._depths: dict[tuple, deque] = {}                   # (node, topic, channel) -> recent depths
        self._restarts: dict[str, tuple[float, str]] = {}       # node -> (when, why)
        self.findings: dict = self._empty(0.0)

    @staticmethod
    def _empty(now):
        return {"sampled_at": now, "nodes": [], "down": [], "restarted": [], "growing": [], "stuck": []}

    def saw(self, producers, now: float) -> None:
        """Remember the nodes a route listed (node: HTTP address, hostname)."""
        for node, hostname in producers:
            self.known[node] = (hostname, now)

    def missing(self, producers, now: float) -> list[str]:
        """Warnings for known nodes absent from ``producers`` (forgetting those gone longer than FORGET_AFTER)."""
        listed = {node for node, _ in producers}
        out = []
        for node, (hostname, seen) in sorted(self.known.items()):
            if node in listed:
                continue
            if now - seen > self.forget_after:
                del self.known[node]
                continue
            out.append(f"nsqd {node} ({hostname}) is no longer listed by any nsqlookupd (last seen "
                       f"{now - seen:.0f}s ago)")
        return out

    def observe(self, now: float, producers, answers: dict) -> dict:
        """One sample: ``producers`` [(node, hostname)] the cluster lists now, ``answers`` {node: /stats doc or
        error text}. Returns (and keeps) the findings."""
        found = self._empty(now)
        gone = self.missing(producers, now)
        self.saw(producers, now)
        hostnames = dict(producers)
        for node, hostname in producers:
            got = answers.get(node, "no answer")
            ok = isinstance(got, dict)
            found["nodes"].append({"node": node, "hostname": hostname, "ok": ok, "error": "" if ok else got})
            if not ok:
                found["down"].append({"node": node, "hostname": hostname, "error": got})
                continue
            self._restart_check(node, got, now)
            self._depth_check(node, got, found)
            self._stuck_check(node, got, found)
            self._last[node] = got
        for line in gone:
            node = line.split(" ", 2)[1]
            found["down"].append({"node": node, "hostname": self.known.get(node, ("", 0))[0], "error": line})
            found["nodes"].append({"node": node, "hostname": self.known.get(node, ("", 0))[0], "ok": False,
                                   "error": line})
        for node, (when, why) in sorted(self._restarts.items()):
            if now - when > self.restart_shown:
                del self._restarts[node]
            else:
                found["restarted"].append({"node": node, "hostname": hostnames.get(node, ""), "why": why})
        self.findings = found
        return found

    def _restart_check(self, node, doc, now):
        before = self._last.get(node)
        if before is None:
            return
        if before.get("start_time") and doc.get("start_time") and before["start_time"] != doc["start_time"]:
            self._restarts[node] = (now, f"start_time {before['start_time']} -> {doc['start_time']}")
            return
        old = _counts(before)
        for key, count in _counts(doc).items():
            if key in old and count < old[key]:
                what = f"{key[0]}/{key[1]}" if key[1] else key[0]
                self._restarts[node] = (now, f"message_count of {what} went back {old[key]} -> {count}")
                return

    def _depth_check(self, node, doc, found):
        seen = set()
        for t in doc.get("topics") or ():
            for c in t.get("channels") or ():
                key = (node, t.get("topic_name", ""), c.get("channel_name", ""))
                seen.add(key)
                depths = self._depths.setdefault(key, deque(maxlen=self.growing_samples + 1))
                depths.append(int(c.get("depth", 0)))
                if len(depths) == depths.maxlen and all(a < b for a, b in zip(depths, list(depths)[1:])):
                    found["growing"].append({"node": node, "topic": key[1], "channel": key[2],
                                             "depth": depths[-1], "samples": len(depths)})
        for key in [k for k in self._depths if k[0] == node and k not in seen]:
            del self._depths[key]

    def _stuck_check(self, node, doc, found):
        before = {}
        for t in (self._last.get(node) or {}).get("topics") or ():
            for c in t.get("channels") or ():
                for cl in c.get("clients") or ():
                    before[(t.get("topic_name"), c.get("channel_name"), cl.get("remote_address"))] = \
                        cl.get("message_count", 0)
        for t in doc.get("topics") or ():
            for c in t.get("channels") or ():
                if t.get("paused") or c.get("paused") or int(c.get("depth", 0)) <= 0:
                    continue
                for cl in c.get("clients") or ():
                    key = (t.get("topic_name"), c.get("channel_name"), cl.get("remote_address"))
                    if cl.get("ready_count", 0) > 0 and cl.get("in_flight_count", 0) == 0 and \
                            key in before and before[key] == cl.get("message_count", 0):
                        found["stuck"].append({"node": node, "topic": key[0], "channel": key[1],
                                               "client_id": cl.get("client_id", ""),
                                               "remote_address": key[2], "ready_count": cl["ready_count"]})
