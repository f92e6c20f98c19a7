"""End-to-end processing latency (nsqd's ``--e2e-processing-latency-percentile``): per channel, how long messages
took from publication to FIN, as percentiles over a sliding window.

Theory of operation
-------------------
nsqd inserts ``now - message timestamp`` into a quantile stream at every FIN and keeps the window as two streams
of ``--e2e-processing-latency-window-time / 2`` each: inserts go to the current one; when it is older than half a
window the other one is emptied and becomes current, and a query merges both. So what /stats shows covers the
last half window to whole window. ``LatencyWindow`` does the same with two buckets of that span, each a bounded
uniform sample (a reservoir, Algorithm R) of the latencies inserted while it was current, with the number
inserted and their maximum:

* **Cost.** Nothing without the flag: a channel's ``e2e`` is None and FIN does not look at it. With it, FIN adds
  one compiled call per FIN batch (``record``: each freed in-flight slot still holds its message's log position;
  the record's timestamp is read there and the latency goes into the reservoir, with one random draw per
  latency once the reservoir is full). Percentiles are computed when the stats plane publishes a channel that
  changed (a sort of at most 2 x RESERVOIR samples), cached until the next insert or rotation.
* **Memory.** At most 2 x RESERVOIR int64 per channel (16 KiB), reserved as FINs arrive (from 64 samples,
  doubling), none for a channel never FINed.
* **Accuracy.** Exact while a bucket holds at most RESERVOIR latencies: the percentile q is the sample of rank
  ceil(q x count) (what a perks stream answers before its first flush; nsqd queries a merge of its two streams,
  whose answer is that rank within perks' targeted error, epsilon 0.01). Past RESERVOIR a bucket is a uniform
  sample standing for its count (a sample weighs count / kept when buckets are merged), so the value returned
  for q is the true one of a rank within about 2 x sqrt(q (1 - q) / RESERVOIR) of q (95%; for p99 of a busy
  channel about +-0.6 percentile points, for the median +-3); the maximum (q = 1.0) stays exact. A topic's
  percentiles are those of its channels' buckets merged the same way (``merged_result``), its count their sum,
  as nsqd's topic merges its channels' streams.
"""
from __future__ import annotations

import time

import numpy as np
from numba import njit

from nsqpy.ipc.inflight import S_LOG_POS, SLOT_WORDS
from nsqpy.ipc.msglog_kernels import KERNEL, valid_record, window_mask
from nsqpy.ipc.msglog_layout import R_TS

__all__ = ["LatencyWindow", "new_window", "merged_result", "RESERVOIR", "BUCKETS", "warm_up"]

RESERVOIR = 1024       # samples a bucket keeps (uniform sample of what it saw beyond that)
BUCKETS = 2            # as nsqd: two streams of half a window each
_FIRST = 64            # samples reserved at a bucket's first insert (doubling up to RESERVOIR)
SEEN, KEPT, MAX = 0, 1, 2   # per-bucket state words


@njit(inline="always", **KERNEL)
def _add(samples, state, x):
    """One latency into the reservoir ``samples`` (state: seen, kept, max; the caller made room, see ``_room``)."""
    state[SEEN] += 1
    if x > state[MAX]:
        state[MAX] = x
    if state[KEPT] < samples.shape[0]:
        samples[state[KEPT]] = x
        state[KEPT] += 1
    else:
        r = np.random.randint(0, state[SEEN])  # Algorithm R: the i-th latency stays with probability cap / i
        if r < samples.shape[0]:
            samples[r] = x


@njit(**KERNEL)
def _record(slots, freed, ctrl, data64, now, samples, state):
    """For each freed slot >= 0 (a FIN: its slot still names the message's log position), insert now - the
    record's timestamp. -> how many were inserted."""
    mask = window_mask(ctrl)
    n = 0
    for i in range(freed.shape[0]):
        s = freed[i]
        if s < 0:
            continue
        pos = slots[s * SLOT_WORDS + S_LOG_POS]
        if not valid_record(ctrl, data64, pos):
            continue  # (not for a slot just freed: its record is retained until the worker's next reclaim pass)
        _add(samples, state, max(now - data64[((pos & mask) >> 3) + R_TS], 0))
        n += 1
    return n


@njit(**KERNEL)
def _insert(samples, state, values):
    for i in range(values.shape[0]):
        _add(samples, state, values[i])


def _result(count, values, weights, maxv, quantiles):
    """(count, percentile values in ns) of the sample arrays ``values`` whose samples weigh ``weights`` (module
    docstring)."""
    if count == 0:
        return 0, (0,) * len(quantiles)
    v = np.concatenate(values)
    order = np.argsort(v, kind="stable")
    v = v[order]
    cum = np.cumsum(np.concatenate(weights)[order])
    total = cum[-1]
    out = []
    for q in quantiles:
        if q >= 1.0:
            out.append(int(maxv))
        else:
            out.append(int(v[min(int(np.searchsorted(cum, q * total, side="left")), len(v) - 1)]))
    return int(count), tuple(out)


class LatencyWindow:
    """One channel's latencies over the last half window to whole window (module docstring)."""

    __slots__ = ("quantiles", "half", "last_move", "current", "samples", "state", "version", "_cached")

    def __init__(self, quantiles, window_ns: int, now_ns: int | None = None):
        self.quantiles = tuple(quantiles)
        self.half = max(int(window_ns) // BUCKETS, 1)
        self.last_move = time.monotonic_ns() if now_ns is None else now_ns
        self.current = 0
        self.samples = [np.empty(0, np.int64) for _ in range(BUCKETS)]
        self.state = np.zeros((BUCKETS, 3), np.int64)
        self.version = 0        # grows with every insert and every rotation that drops samples
        self._cached = (-1, None)

    def rotate(self, now_ns: int) -> None:
        """Move the window to now (nsqd's moveWindow, as often as half windows went by)."""
        d = now_ns - self.last_move
        if d <= self.half:
            return
        k = (d + self.half - 1) // self.half - 1   # rotations until now is within half a window of the last
        for _ in range(min(k, BUCKETS)):
            self.current = (self.current + 1) % BUCKETS
            if self.state[self.current, SEEN]:
                self.version += 1
            self.state[self.current] = 0
        self.last_move += k * self.half

    def _room(self, n: int):
        """The current bucket's sample array, grown (doubling, up to RESERVOIR) to take n more."""
        c = self.current
        buf = self.samples[c]
        kept = int(self.state[c, KEPT])
        if kept + n > len(buf) and len(buf) < RESERVOIR:
            size = max(len(buf), _FIRST)
            while size < kept + n and size < RESERVOIR:
                size *= 2
            grown = np.empty(min(size, RESERVOIR), np.int64)
            grown[:kept] = buf[:kept]
            self.samples[c] = buf = grown
        return buf

    def record(self, log, slots, freed, now_mono: int | None = None) -> int:
        """FIN of the in-flight slots ``freed`` (entries < 0 are skipped): their latencies, from the records'
        timestamps in ``log``, go into the window. -> how many."""
        self.rotate(time.monotonic_ns() if now_mono is None else now_mono)
        c = self.current
        n = _record(slots, freed, log.ctrl, log.window.data64, time.time_ns(), self._room(len(freed)),
                    self.state[c])
        if n:
            self.version += 1
        return n

    def insert(self, latencies, now_mono: int | None = None) -> None:
        """Insert latencies (ns) directly: known inputs (tests), where ``record`` reads them from the log."""
        self.rotate(time.monotonic_ns() if now_mono is None else now_mono)
        lat = np.asarray(latencies, np.int64)
        _insert(self._room(len(lat)), self.state[self.current], lat)
        if len(lat):
            self.version += 1

    def parts(self):
        """(count, values, weights, max) of the buckets as they are (call ``rotate`` first)."""
        values, weights = [], []
        for b in range(BUCKETS):
            seen, kept = int(self.state[b, SEEN]), int(self.state[b, KEPT])
            if kept:
                values.append(self.samples[b][:kept])
                weights.append(np.full(kept, seen / kept))
        return int(self.state[:, SEEN].sum()), values, weights, int(self.state[:, MAX].max())

    def result(self, now_mono: int | None = None):
        """(count, values in ns, one per quantile) of the window now."""
        self.rotate(time.monotonic_ns() if now_mono is None else now_mono)
        version, cached = self._cached
        if version == self.version:
            return cached
        out = _result(*self.parts(), self.quantiles)
        self._cached = (self.version, out)
        return out

    def holds_data(self) -> bool:
        return bool(self.state[:, SEEN].any())

    def next_change_ns(self) -> int:
        """Monotonic time at which the next rotation may drop samples (when the stats must be shown again)."""
        return self.last_move + self.half + 1

    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.samples) + self.state.nbytes


def merged_result(windows, quantiles, now_mono: int | None = None):
    """A topic's (count, values): its channels' windows merged (nsqd's AggregateChannelE2eProcessingLatency)."""
    now = time.monotonic_ns() if now_mono is None else now_mono
    count, maxv, values, weights = 0, 0, [], []
    for w in windows:
        w.rotate(now)
        c, v, wt, m = w.parts()
        count += c
        maxv = max(maxv, m)
        values += v
        weights += wt
    return _result(count, values, weights, maxv, quantiles)


def new_window(opts):
    """A channel's window, or None without ``--e2e-processing-latency-percentile`` (then FIN does nothing more)."""
    quantiles = getattr(opts, "e2e_processing_latency_percentile", None)
    if not quantiles:
        return None
    return LatencyWindow(quantiles, opts.e2e_processing_latency_window_time)


def warm_up():
    """Compile (or load) the kernel before fork (a worker's first FIN then costs nothing extra)."""
    from nsqpy.ipc.msglog_layout import ctrl_nbytes
    ctrl = np.zeros(ctrl_nbytes(1, 1) // 8, np.int64)
    _record(np.zeros(SLOT_WORDS, np.int64), np.full(1, -1, np.int64), ctrl, np.zeros(8, np.int64), 0,
            np.zeros(4, np.int64), np.zeros(3, np.int64))
    _insert(np.zeros(4, np.int64), np.zeros(3, np.int64), np.ones(2, np.int64))
