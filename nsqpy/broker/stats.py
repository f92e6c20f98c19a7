"""The stats plane: every topic, channel and client counter of a running nsqd, from any process, as /stats JSON.

Theory of operation
-------------------
Counters live in the Python objects of the worker that owns them (a topic and its channels in the topic's owner;
a client in the worker serving its connection: consumers sit with their topic's owner, producers wherever the
acceptor put them). Each worker publishes them (``workers/domain/stats_rows.py``) as rows of its own one-writer table in
shared memory (``ipc/statrows.py``: per-row double buffering, so a reader never waits on a writer and a crashed
writer leaves whole rows). This module is the schema of those rows and the reader.

Rows (ROW_WORDS int64 words each; "body" words are written once, "counters" are the double-buffered copy):

    kind     body                                                counters
    TOPIC    name                                                depth, backend_depth, message_count,
                                                                 message_bytes, paused
    CHANNEL  parent = topic uid, name                            depth, backend_depth, in_flight_count,
                                                                 deferred_count, message_count, requeue_count,
                                                                 timeout_count, paused
    CLIENT   (nothing)                                           state, ready_count, in_flight_count,
                                                                 message_count, finish_count, requeue_count,
                                                                 text version, text length, channel uid (0: none)
    PUB      parent = client uid, topic name                     count (the client's pub_counts entry)
    TEXT     parent = client uid, part | version << 20, 216 bytes of the client's identity JSON (client_id,
             hostname, user_agent, remote address, connect time, IDENTIFY results, TLS/auth details); written
             once per IDENTIFY, replaced as a whole (new version first, then the client row, then the old parts go)
    E2E      parent = topic or channel uid, part | n << 8,       count, n values (ns)
             n quantiles (float64 bits, up to 8 a part)
             only with --e2e-processing-latency-percentile: a channel's from its creation, a topic's while it has
             channels (nsqd's topic without channels shows no percentiles); parts hold quantiles 8 x part onwards
    POLICY   parent = channel uid, dead-letter topic name            dead_lettered_count, expired_count,
                                                                 dropped_count, max_attempts, message_ttl_ms,
                                                                 max_depth, max_bytes, overflow (POLICY_OVERFLOWS
                                                                 index), on (1: a policy is in effect)
             nsqpy's policies (issue 49): only for a channel whose policy is not off or that dropped, expired or
             dead-lettered a message, so a broker without policies has none and /stats shows NSQ's fields only; a
             new dead-letter name is a new row (names are written once)

A reader joins the rows of all workers: channels to topics by uid, consumers to channels by the channel uid in
their counters, PUB rows to their clients. Names and identities never change for a uid (uids are never reused),
so a long-lived reader decodes each once and keeps it (``_names``, ``_idents``), and it keeps what it built: a
worker none of whose rows changed (same KIND, UID and GEN everywhere) gives its last part as it was, and
otherwise only the dicts of rows whose GEN moved are made anew (``_build``). So the cost of a snapshot follows
what changed; a snapshot of 1000 topics with 5 channels each in which everything changed is mostly building
dicts (benchmarks/stats_snapshot.py). Results are therefore read-only: serialise them, never modify them.

Freshness: a worker republishes what changed at most every ``nsqpy.workers.domain.stats_rows.PERIOD`` (100 ms), and at once when a
reader asks (``refresh``: a ticket per worker on the board, a wake-up for sleeping workers, through their eventfds
when the reader holds the Plan, else STATS_WAKE_SIGNAL, then a wait, bounded by ``timeout``, until each worker
answered it). A worker that is dead (its pid and start time on the board) is not waited for; a dead or busy one
contributes its last publication; ``fresh`` tells which workers answered. So after clients stop, one ``stats()``
call returns exact numbers.

Layering: this module uses ``ipc`` and ``nsqpy.protocol`` only; the HTTP API (gunicorn workers forked from the
supervisor, holding the Plan) and offline tools (``StatsReader.attach(data_path, node_id)``) both use it.
"""
from __future__ import annotations

import dataclasses
import gc
import itertools
import json
import os
import signal
import time
from functools import partial

import numpy as np

from nsqpy.ipc.shm import Segment, segment_name
from nsqpy.ipc.statrows import (B_PID, B_USER, BODY_WORDS, R_BODY, R_GEN, R_KIND, R_UID, Board, RowReader, counters_of,
                          writer_alive)
from nsqpy.protocol.identify import ServerSettings

__all__ = ["StatsReader", "create_board", "board_name", "table_name", "encode_name", "encode_text", "VERSION",
           "KIND_TOPIC", "KIND_CHANNEL", "KIND_CLIENT", "KIND_PUB", "KIND_TEXT", "KIND_E2E", "KIND_POLICY",
           "POLICY_OVERFLOWS", "REFRESH_TIMEOUT",
           "STATS_WAKE_SIGNAL", "encode_e2e", "e2e_counters"]

# How a reader that does not hold the Plan's eventfds wakes a sleeping worker: the worker's loop turns it into an
# fd event (workers/processes/event_loop.py); its default action is to be ignored, so a worker that has not installed its handler
# yet is not hurt by it.
STATS_WAKE_SIGNAL = signal.SIGURG
VERSION = next(f.default for f in dataclasses.fields(ServerSettings) if f.name == "version")  # NSQ's, "1.3.0"
REFRESH_TIMEOUT = 0.5   # seconds a fresh snapshot waits for the workers before it takes their last publication

KIND_TOPIC, KIND_CHANNEL, KIND_CLIENT, KIND_PUB, KIND_TEXT, KIND_E2E, KIND_POLICY = 1, 2, 3, 4, 5, 6, 7
# a POLICY row's overflow word indexes this (workers/domain/policy.py's OVERFLOWS, a floor above: a test holds them
# equal)
POLICY_OVERFLOWS = ("block", "reject", "drop_oldest")
# body words
I_PARENT, I_AUX, I_NAME = 0, 1, 2
NAME_WORDS = 8
NAME_BYTES = 8 * NAME_WORDS          # NSQ's names are at most 64 characters
TEXT_AT = 2
TEXT_BYTES = 8 * (BODY_WORDS - TEXT_AT)
TEXT_VER_SHIFT = 20
E2E_PER_ROW = 8                      # quantiles an E2E row holds (body words 2..9; counters 1..8)
E2E_N_SHIFT = 8
# counter columns
T_DEPTH, T_BACKEND, T_MESSAGES, T_BYTES, T_PAUSED = range(5)
C_DEPTH, C_BACKEND, C_IN_FLIGHT, C_DEFERRED, C_MESSAGES, C_REQUEUES, C_TIMEOUTS, C_PAUSED = range(8)
P_DEAD, P_EXPIRED, P_DROPPED, P_ATTEMPTS, P_TTL_MS, P_DEPTH, P_BYTES, P_OVERFLOW, P_ON = range(9)
K_STATE, K_READY, K_IN_FLIGHT, K_MESSAGES, K_FINISHED, K_REQUEUED, K_TEXT_VER, K_TEXT_LEN, K_CHANNEL = range(9)
# the writers' user words on the board (U_COST_NS, U_WRITTEN: of the last publication that wrote any row)
U_RSS, U_GC_RUNS, U_COST_NS, U_WRITTEN, U_INFLIGHT, U_INFLIGHT_CAP, U_TABLE_BLOCKED, U_DEFERRED = range(8)
G_START_TIME = 0

_PARENT = R_BODY + I_PARENT
_AUX = R_BODY + I_AUX
_NAME = R_BODY + I_NAME


def board_name(data_path: str, node_id: int) -> str:
    return segment_name(data_path, node_id, "stats", 0)


def table_name(data_path: str, node_id: int, worker: int, generation: int) -> str:
    return segment_name(data_path, node_id, f"stats{worker}", generation)


def create_board(seg, workers: int) -> Board:
    """The board, in a segment the supervisor created before fork (workers/processes/plan.py), stamped with the start time
    /stats reports."""
    board = Board.create(seg.buf, workers)
    board.set_global(G_START_TIME, int(time.time()))
    return board


def encode_name(name: str) -> list:
    """A topic or channel name as body words [name length, 8 name words] (I_AUX onwards)."""
    raw = name.encode()[:NAME_BYTES]
    return [len(raw)] + np.frombuffer(raw.ljust(NAME_BYTES, b"\0"), np.int64).tolist()


def encode_text(parent: int, version: int, data: bytes) -> list:
    """The bodies of the TEXT rows that carry ``data`` for the row ``parent`` (one per TEXT_BYTES)."""
    bodies = []
    for part, k in enumerate(range(0, max(len(data), 1), TEXT_BYTES)):
        chunk = data[k:k + TEXT_BYTES].ljust(TEXT_BYTES, b"\0")
        bodies.append([parent, part | version << TEXT_VER_SHIFT] + np.frombuffer(chunk, np.int64).tolist())
    return bodies


def encode_e2e(quantiles) -> list:
    """The named words (after the parent) of the E2E rows for these quantiles: one list per part."""
    out = []
    for part, k in enumerate(range(0, len(quantiles), E2E_PER_ROW)):
        qs = np.array(quantiles[k:k + E2E_PER_ROW], np.float64)
        out.append([part | len(qs) << E2E_N_SHIFT] + qs.view(np.int64).tolist())
    return out


def e2e_counters(count: int, values) -> list:
    """The counters of the E2E rows of a (count, values) result: one tuple per part."""
    return [(count,) + tuple(values[k:k + E2E_PER_ROW]) for k in range(0, len(values), E2E_PER_ROW)]


# what nsqd reports with no --e2e-processing-latency-percentile, and for a topic without channels (one shared
# object: results are read-only)
_E2E = {"count": 0, "percentiles": None}


class StatsReader:
    """Reads the stats plane of one broker. Keep one per process: it caches decoded names and identities."""

    def __init__(self, board: Board, data_path: str, node_id: int, waker=None, segment=None, name_of=None):
        self.board = board
        self.workers = board.writers
        self.waker = waker            # waker(worker): wake a sleeping worker (a Plan's eventfds), optional
        self._segment = segment       # the board's segment when attached by name (kept mapped)
        name_of = name_of or partial(table_name, data_path, node_id)  # name_of(worker, generation) (tests: others)
        self.readers = [RowReader(board, w, partial(name_of, w)) for w in range(self.workers)]
        self._names = [{} for _ in range(self.workers)]    # uid -> name (topics, channels, PUB rows)
        self._idents = [{} for _ in range(self.workers)]   # client uid -> (text version, identity dict)
        self._orders = [{} for _ in range(self.workers)]   # "topics"/"grouped" -> (uids, their /stats order)
        self._views = [None] * self.workers                # (filters, row fingerprint, the worker's part)
        self._last = [None] * self.workers                 # what the last unfiltered build made (see _build)
        self._pubs = [None] * self.workers                 # (topic filter, PUB rows, pub_counts lists)
        self._e2e = [{} for _ in range(self.workers)]      # parent uid -> (its E2E rows' (uid, GEN)s, its dict)
        self._policies = [None] * self.workers             # (POLICY rows' words, the result, uid -> (GEN, dict))
        self.fresh = [False] * self.workers               # which workers answered the last refresh

    @classmethod
    def from_plan(cls, plan) -> "StatsReader":
        """In a process forked from the supervisor (the HTTP API): the Plan's board, and its eventfds to wake
        sleeping workers."""
        links = getattr(plan, "link_set", None)
        return cls(plan.stats_board, plan.data_path, plan.node_id, waker=links.wake if links is not None else None)

    @classmethod
    def attach(cls, data_path: str, node_id: int) -> "StatsReader":
        """In any process: find the broker by its data path and node id. Without the Plan's eventfds, sleeping
        workers are woken with STATS_WAKE_SIGNAL."""
        seg = Segment.attach(board_name(data_path, node_id))
        board = Board.attach(seg.buf)
        return cls(board, data_path, node_id, waker=partial(_signal_worker, board), segment=seg)

    def close(self) -> None:
        for r in self.readers:
            r.close()
        self.board = None
        if self._segment is not None:
            self._segment.close()
            self._segment = None

    # ---- freshness -------------------------------------------------------------------------------------
    def refresh(self, timeout: float = REFRESH_TIMEOUT) -> list:
        """Ask every worker to publish now and wait (at most timeout seconds) until each did; -> per worker,
        whether it answered (a dead or busy worker did not: its last publication stands)."""
        board = self.board
        tickets = [board.take_ticket(w) for w in range(self.workers)]
        if self.waker is not None:
            for w in range(self.workers):
                self.waker(w)
        fresh = [False] * self.workers
        waiting = set(range(self.workers))
        start = time.monotonic()
        deadline, look_alive = start + timeout, start + 0.02
        pause = 20e-6
        while True:
            for w in list(waiting):
                if board.done(w) >= tickets[w]:
                    waiting.discard(w)
                    fresh[w] = True
            now = time.monotonic()
            if not waiting or now >= deadline:
                break
            if now >= look_alive:  # a dead worker will not answer: do not wait the whole timeout for it
                waiting = {w for w in waiting if writer_alive(board, w)}
                look_alive = now + 0.05
            time.sleep(pause)  # the worker's answer is one shared word; it comes within one loop iteration
            pause = min(pause * 2, 0.002)
        self.fresh = fresh
        return fresh

    # ---- the snapshot ----------------------------------------------------------------------------------
    def stats(self, topic: str = "", channel: str = "", include_clients: bool = True, include_mem: bool = True,
              fresh: bool = True, timeout: float = REFRESH_TIMEOUT, nsqpy_fields: bool = False) -> dict:
        """The dict ``/stats?format=json`` returns (spec 2.3), with its filters. ``fresh``: ask the workers to
        publish first (see ``refresh``); else the last publications (at most PERIOD old while they are busy).
        ``nsqpy_fields`` adds to each client what NSQ 1.x no longer shows (output_buffer_size,
        output_buffer_timeout, heartbeat_interval, msg_timeout in ms) and the serving worker.

        The result is read-only: parts of it (a worker's topics whose rows did not change, the empty lists, the
        e2e placeholder) are shared with earlier and later results. Serialise it, do not modify it."""
        if fresh:
            self.refresh(timeout)
        key = (topic, channel, bool(include_clients), bool(nsqpy_fields))
        collecting = gc.isenabled()
        gc.disable()  # tens of thousands of small containers, all kept: generation-0 passes would only cost
        try:
            views = [self._view(w, r.rows(), key) for w, r in enumerate(self.readers)]
        finally:
            if collecting:
                gc.enable()
        topics = [t for v in views for t in v[0]]
        start = self.board.global_word(G_START_TIME)
        if topic and not topics:
            # nsqd returns before it collects anything when the topic does not exist: both lists are null
            out = {"version": VERSION, "health": "OK", "start_time": start, "topics": None}
            if include_mem:
                out["memory"] = self._memory()
            out["producers"] = None
            return out
        if len(views) > 1:
            topics.sort(key=_topic_key)  # each worker's are sorted already: a merge of sorted runs
        if channel:
            topics = [t for t in topics if t["channels"]]  # nsqd skips a topic that lacks the channel
        out = {"version": VERSION, "health": "OK", "start_time": start, "topics": topics}
        if include_mem:
            out["memory"] = self._memory()
        producers = None
        if include_clients:
            producers = [p for v in views for p in v[1]] or None
            if producers:
                producers.sort(key=_client_key)
        out["producers"] = producers
        return out

    def _memory(self) -> dict:
        """nsqd reports Go's heap; the nearest we have is each worker's resident memory and GC runs."""
        rss = sum(self.board.word(w, B_USER + U_RSS) for w in range(self.workers))
        runs = sum(self.board.word(w, B_USER + U_GC_RUNS) for w in range(self.workers))
        word = self.board.word
        # nsqpy's own capacities per worker (NSQ has no such field; its readers ignore unknown keys): the
        # in-flight table's use, the channels a full table holds back, and the deferred messages waiting
        workers = [{"in_flight": word(w, B_USER + U_INFLIGHT), "in_flight_capacity": word(w, B_USER + U_INFLIGHT_CAP),
                    "channels_held_by_full_table": word(w, B_USER + U_TABLE_BLOCKED),
                    "deferred": word(w, B_USER + U_DEFERRED)} for w in range(self.workers)]
        return {"heap_objects": 0, "heap_idle_bytes": 0, "heap_in_use_bytes": rss, "heap_released_bytes": 0,
                "gc_pause_usec_100": 0, "gc_pause_usec_99": 0, "gc_pause_usec_95": 0, "next_gc_bytes": 0,
                "gc_total_runs": runs, "nsqpy_workers": workers}

    def _view(self, w, rows, key):
        """One worker's part: (its topic dicts, sorted, with their channels and consumers; its producers). When
        none of its rows changed since the last call with the same filters (KIND, UID and GEN of every row are
        the same: any creation, update or free changes one), the last part is returned as it was."""
        fp = rows[:, :R_BODY]
        last = self._views[w]
        if last is not None and last[0] == key and np.array_equal(last[1], fp):
            return last[2]
        part, whole = self._build(w, rows, *key)
        self._views[w] = (key, fp.copy(), part) if whole else None
        if len(self._names[w]) > 2 * len(rows) + 1024:
            live = set(rows[:, R_UID].tolist())
            self._names[w] = {u: n for u, n in self._names[w].items() if u in live}
        return part

    def _order(self, w, which, rows, sel):
        """(sel sorted by name, their names): sel holds the row indices of one kind. Cached while the same rows hold
        the same uids, since names never change for a uid: a snapshot sorts only when topics or channels come or
        go."""
        uids = rows[sel, R_UID]
        last = self._orders[w].get(which)
        if last is not None and np.array_equal(last[0], uids):
            return sel[last[1]], last[2]
        names = self._names[w]
        keys = [names.get(u) or self._name(names, rows, i, u) for i, u in zip(sel.tolist(), uids.tolist())]
        perm = sorted(range(len(keys)), key=keys.__getitem__)
        ordered = [keys[k] for k in perm]
        perm = np.array(perm, np.int64)
        self._orders[w][which] = (uids, perm, ordered)
        return sel[perm], ordered

    @staticmethod
    def _name(names, rows, i, uid):
        name = names[uid] = _decode_name(rows[i])
        return name

    def _grouped(self, w, rows, t_uids, csel, cache):
        """The channel rows csel ordered as /stats shows them: by their topic's place in t_uids (channels of other
        topics are dropped), by name within a topic; -> (row indices, names, bounds: topic k's channels are
        [bounds[k], bounds[k + 1])). Cached while topics and channels stay the same (uids, in row order)."""
        c_uids = rows[csel, R_UID]
        last = self._orders[w].get("grouped") if cache else None
        if last is not None and np.array_equal(last[0], t_uids) and np.array_equal(last[1], c_uids):
            return csel[last[2]], last[3], last[4]
        names = self._names[w]
        parents = rows[csel, _PARENT]
        if len(t_uids):
            by_uid = np.argsort(t_uids, kind="stable")
            sorted_uids = t_uids[by_uid]
            at = np.minimum(np.searchsorted(sorted_uids, parents), len(t_uids) - 1)
            keep = np.flatnonzero(sorted_uids[at] == parents)
            place = by_uid[at[keep]].tolist()
        else:
            keep, place = np.zeros(0, np.int64), []
        cn = [names.get(u) or self._name(names, rows, i, u) for i, u in zip(csel[keep].tolist(), c_uids[keep].tolist())]
        order = sorted(range(len(cn)), key=lambda k: (place[k], cn[k]))
        perm = keep[np.array(order, np.int64)] if order else np.zeros(0, np.int64)
        ordered = [cn[k] for k in order]
        bounds = np.searchsorted(np.array([place[k] for k in order], np.int64), np.arange(len(t_uids) + 1))
        if cache:
            self._orders[w]["grouped"] = (t_uids.copy(), c_uids, perm, ordered, bounds)
        return csel[perm], ordered, bounds

    def _build(self, w, rows, topic, channel, include_clients, nsqpy_fields):
        """Build one worker's part. Without filters, what the last call built is kept (topics in name order, all
        channels in /stats order): when the same topics and channels are there, only the dicts of rows whose GEN
        moved (and of channels with consumers, whose client lists are rebuilt every time) are made anew, with
        their topics; the rest are the last call's objects. So the cost is in what changed (numpy finds it)."""
        kind = rows[:, R_KIND]
        uids = rows[:, R_UID]
        gens = rows[:, R_GEN]
        counts = counters_of(rows)
        whole = True
        plain = not topic and not channel

        tsel, t_names = self._order(w, "topics", rows, np.flatnonzero(kind == KIND_TOPIC))
        if topic:
            keep = [k for k, name in enumerate(t_names) if name == topic]
            tsel, t_names = tsel[np.array(keep, np.int64)], [t_names[k] for k in keep]
        t_uids = uids[tsel]
        csel = np.flatnonzero(kind == KIND_CHANNEL)
        if topic:
            csel = csel[np.isin(rows[csel, _PARENT], t_uids)]
        csel, c_names, bounds = self._grouped(w, rows, t_uids, csel, plain)
        c_uids = uids[csel]

        ksel = np.flatnonzero(kind == KIND_CLIENT)
        k_counts = counts[ksel]
        k_chan = k_counts[:, K_CHANNEL]
        k_chan = k_chan[k_chan != 0]
        consumers = np.zeros(len(csel), np.int64)  # per channel (client_count is shown even without clients)
        if len(k_chan) and len(csel):
            cu, cc = np.unique(k_chan, return_counts=True)
            at = np.minimum(np.searchsorted(cu, c_uids), len(cu) - 1)
            consumers = np.where(cu[at] == c_uids, cc[at], 0)
        c_gens, t_gens = gens[csel], gens[tsel]
        esel = np.flatnonzero(kind == KIND_E2E)
        e2e = {}
        if len(esel):  # (only with --e2e-processing-latency-percentile) a row's dict is made anew when its E2E
            e2e, parents, marks = self._e2e_dicts(w, rows, esel, counts)  # rows change: folded into its GEN
            c_gens = c_gens + _e2e_marks(c_uids, parents, marks)
            t_gens = t_gens + _e2e_marks(t_uids, parents, marks)

        psel = np.flatnonzero(kind == KIND_POLICY)
        policies = {}
        if len(psel):  # (only with nsqpy's policies) as E2E rows: a change is folded into the channel's GEN
            policies, parents, marks = self._policy_dicts(w, rows, psel, counts)
            c_gens = c_gens + (_e2e_marks(c_uids, parents, marks) << 32)

        last = self._last[w]
        if plain and last is not None and last[0] is include_clients and np.array_equal(last[1], t_uids) \
                and np.array_equal(last[2], c_uids):
            _, _, _, last_t_gens, last_c_gens, last_consumers, chans, topics = last
            redo = np.flatnonzero((c_gens != last_c_gens) | (consumers != 0) | (last_consumers != 0))
            t_redo = np.union1d(np.flatnonzero(t_gens != last_t_gens),
                                np.searchsorted(bounds, redo, side="right") - 1)
            chans, topics = list(chans), list(topics)
        else:
            redo, t_redo = None, None
        empty = () if include_clients else None
        channels_by_uid = {}
        edges = bounds.tolist()
        if redo is None and not channel:
            # everything anew, without a filter: comprehensions (a third faster than the loops below)
            chans = [{"channel_name": name, "depth": depth, "backend_depth": backend, "in_flight_count": in_flight,
                      "deferred_count": deferred, "message_count": messages, "requeue_count": requeues,
                      "timeout_count": timeouts, "client_count": n, "clients": [] if n and include_clients else empty,
                      "paused": paused != 0, "e2e_processing_latency": lat}
                     for name, lat, n, (depth, backend, in_flight, deferred, messages, requeues, timeouts, paused, _)
                     in zip(c_names, _e2e_of(e2e, c_uids), consumers.tolist(), counts[csel].tolist())]
            for k in np.flatnonzero(consumers).tolist():
                channels_by_uid[int(c_uids[k])] = chans[k]
            if policies:
                for k, uid in enumerate(c_uids.tolist()):
                    if uid in policies:
                        chans[k].update(policies[uid])
            topics = [{"topic_name": name, "channels": chans[a:b], "depth": depth, "backend_depth": backend,
                       "message_count": messages, "message_bytes": nbytes, "paused": paused != 0,
                       "e2e_processing_latency": lat}
                      for name, lat, a, b, (depth, backend, messages, nbytes, paused, *_)
                      in zip(t_names, _e2e_of(e2e, t_uids), edges, edges[1:], counts[tsel].tolist())]
            redo = t_redo = np.zeros(0, np.int64)
        elif redo is None:
            redo, t_redo = np.arange(len(csel)), np.arange(len(tsel))
            chans, topics = [None] * len(csel), [None] * len(tsel)
        for k, uid, n, (depth, backend, in_flight, deferred, messages, requeues, timeouts, paused, _) in zip(
                redo.tolist(), c_uids[redo].tolist(), consumers[redo].tolist(), counts[csel[redo]].tolist()):
            name = c_names[k]
            if channel and name != channel:
                continue
            d = chans[k] = {
                "channel_name": name, "depth": depth, "backend_depth": backend, "in_flight_count": in_flight,
                "deferred_count": deferred, "message_count": messages, "requeue_count": requeues,
                "timeout_count": timeouts, "client_count": n, "clients": [] if n and include_clients else empty,
                "paused": paused != 0, "e2e_processing_latency": e2e.get(uid, _E2E)}
            if policies and uid in policies:
                d.update(policies[uid])
            if n:
                channels_by_uid[uid] = d
        for k, (depth, backend, messages, nbytes, paused, *_) in zip(t_redo.tolist(), counts[tsel[t_redo]].tolist()):
            mine = chans[edges[k]:edges[k + 1]]
            if channel:
                mine = [d for d in mine if d is not None]
            topics[k] = {"topic_name": t_names[k], "channels": mine, "depth": depth, "backend_depth": backend,
                         "message_count": messages, "message_bytes": nbytes, "paused": paused != 0,
                         "e2e_processing_latency": e2e.get(int(t_uids[k]), _E2E)}
        if plain:  # (a filtered call leaves it: the next plain one still builds on it)
            self._last[w] = (include_clients, t_uids, c_uids, t_gens, c_gens, consumers, chans, topics)

        producers = []
        if include_clients and len(ksel):
            producers, pubs, idents, whole = self._producers(w, rows, kind, counts, topic, nsqpy_fields, ksel,
                                                             k_counts)
            for uid, c in zip(uids[ksel].tolist(), k_counts.tolist()):
                ch = channels_by_uid.get(c[K_CHANNEL]) if c[K_CHANNEL] else None
                if ch is not None:
                    d = pubs.get(uid)  # a consumer that also published is the same ClientStats in both lists
                    ch["clients"].append(d if d is not None else
                                         _client(idents.get(uid), c, None, w if nsqpy_fields else None))
        return (topics, producers), whole

    def _e2e_dicts(self, w, rows, esel, counts):
        """({parent uid: its e2e_processing_latency dict}, the parents' uids sorted, per parent the sum of its E2E
        rows' GEN + 1, which grows with any change of them). A dict is kept while its rows' (uid, GEN) stay."""
        groups = {}
        for i, parent, aux, uid, gen in zip(esel.tolist(), rows[esel, _PARENT].tolist(), rows[esel, _AUX].tolist(),
                                            rows[esel, R_UID].tolist(), rows[esel, R_GEN].tolist()):
            groups.setdefault(parent, []).append((aux & ((1 << E2E_N_SHIFT) - 1), aux >> E2E_N_SHIFT, i, uid, gen))
        last, kept, out = self._e2e[w], {}, {}
        for parent, parts in groups.items():
            parts.sort()
            key = tuple((uid, gen) for *_, uid, gen in parts)
            had = last.get(parent)
            if had is not None and had[0] == key:
                d = had[1]
            else:
                pct = []
                for _, n, i, _, _ in parts:
                    qs = rows[i, _NAME:_NAME + n].view(np.float64).tolist()
                    pct += [{"quantile": int(q) if q.is_integer() else q, "value": v}  # (Go prints 1.0 as 1)
                            for q, v in zip(qs, counts[i, 1:1 + n].tolist())]
                d = {"count": int(counts[parts[0][2], 0]), "percentiles": pct}
            kept[parent] = (key, d)
            out[parent] = d
        self._e2e[w] = kept
        parents, inverse = np.unique(rows[esel, _PARENT], return_inverse=True)
        marks = np.zeros(len(parents), np.int64)
        np.add.at(marks, inverse, rows[esel, R_GEN] + 1)
        return out, parents, marks

    def _policy_dicts(self, w, rows, psel, counts):
        """({channel uid: what its POLICY row adds to its /stats dict}, the channels' uids sorted, per channel a
        mark of its row's UID and GEN, as ``_e2e_dicts``' marks). All kept while the POLICY rows stay the same (GEN, KIND, UID and
        parent of each); else a row's dict is made anew only when its UID or GEN moved."""
        seen = rows[psel, :_PARENT + 1]
        last = self._policies[w]
        if last is not None and np.array_equal(last[0], seen):
            return last[1]
        known = last[2] if last is not None else {}
        kept, out = {}, {}
        for i, parent, uid, gen in zip(psel.tolist(), rows[psel, _PARENT].tolist(), rows[psel, R_UID].tolist(),
                                       rows[psel, R_GEN].tolist()):
            had = known.get(uid)
            if had is not None and had[0] == gen:
                d = had[1]
            else:
                c = counts[i].tolist()
                d = {"dead_lettered_count": c[P_DEAD], "expired_count": c[P_EXPIRED], "dropped_count": c[P_DROPPED]}
                if c[P_ON]:
                    d["policy"] = {"max_attempts": c[P_ATTEMPTS], "dead_letter_topic": _decode_name(rows[i]),
                                   "message_ttl_ms": c[P_TTL_MS], "max_depth": c[P_DEPTH], "max_bytes": c[P_BYTES],
                                   "overflow": POLICY_OVERFLOWS[c[P_OVERFLOW]] if 0 <= c[P_OVERFLOW] < 3
                                   else "block"}
            kept[uid] = (gen, d)
            out[parent] = d
        parents, inverse = np.unique(rows[psel, _PARENT], return_inverse=True)
        marks = np.zeros(len(parents), np.int64)
        # a channel has one POLICY row; a new one (a new dead-letter name) has a new UID and may have its
        # predecessor's GEN: both go into the mark (31 bits, so that the caller's << 32 stays in int64)
        np.add.at(marks, inverse, (rows[psel, R_UID] * 1_000_003 + rows[psel, R_GEN] + 1) & 0x7FFFFFFF)
        result = (out, parents, marks)
        self._policies[w] = (seen.copy(), result, kept)
        return result

    def _producers(self, w, rows, kind, counts, topic, nsqpy_fields, ksel, k_counts):
        """(producer dicts, {client uid: its dict} for producers, {client uid: identity}, every identity whole)."""
        uids = rows[ksel, R_UID].tolist()
        c_counts = k_counts.tolist()
        names = self._names[w]
        pub_counts = self._pub_counts(w, rows, kind, counts, names, topic)
        idents, whole = self._identities(w, rows, kind, uids, c_counts)
        out, by_uid = [], {}
        for uid, c in zip(uids, c_counts):
            pc = pub_counts.get(uid)
            if pc is not None:
                d = by_uid[uid] = _client(idents.get(uid), c, pc, w if nsqpy_fields else None)
                out.append(d)
        return out, by_uid, idents, whole

    def _pub_counts(self, w, rows, kind, counts, names, topic):
        """client uid -> its pub_counts list (only ``topic``'s entry when filtering, as nsqd). Kept while the PUB
        rows stay the same (a producer of many topics has as many rows)."""
        sel = np.flatnonzero(kind == KIND_PUB)
        seen = rows[sel, :_PARENT + 1]  # GEN, KIND, UID, PARENT
        last = self._pubs[w]
        if last is not None and last[0] == topic and np.array_equal(last[1], seen):
            return last[2]
        pubs = {}
        for i, uid, parent, n in zip(sel.tolist(), rows[sel, R_UID].tolist(), rows[sel, _PARENT].tolist(),
                                     counts[sel, 0].tolist()):
            name = names.get(uid) or self._name(names, rows, i, uid)
            entries = pubs.get(parent)
            if entries is None:
                entries = pubs[parent] = []
            if not topic or name == topic:
                entries.append({"topic": name, "count": n})
        for entries in pubs.values():
            if len(entries) > 1:
                entries.sort(key=_topic_of)
        self._pubs[w] = (topic, seen, pubs)
        return pubs

    def _identities(self, w, rows, kind, uids, counts):
        """(client uid -> its identity dict, decoded once per client and IDENTIFY; whether all were whole)."""
        known, out, need = self._idents[w], {}, {}
        for uid, c in zip(uids, counts):
            had = known.get(uid)
            if had is not None and had[0] == c[K_TEXT_VER]:
                out[uid] = had
            else:
                need[(uid, c[K_TEXT_VER])] = c[K_TEXT_LEN]
                if had is not None:
                    out[uid] = had  # until the new text is whole in a snapshot, the previous one stands
        whole = True
        if need:
            parts = {}
            sel = np.flatnonzero(kind == KIND_TEXT)
            for i, parent, aux in zip(sel.tolist(), rows[sel, _PARENT].tolist(), rows[sel, _AUX].tolist()):
                key = (parent, aux >> TEXT_VER_SHIFT)
                if key in need:
                    parts.setdefault(key, {})[aux & ((1 << TEXT_VER_SHIFT) - 1)] = rows[i, R_BODY + TEXT_AT:]
            for (uid, ver), length in need.items():
                got = parts.get((uid, ver), {})
                data = b"".join(got[k].tobytes() for k in sorted(got))[:length]
                try:
                    if len(data) != length or len(got) != -(-length // TEXT_BYTES):
                        raise ValueError("incomplete")
                    out[uid] = (ver, json.loads(data))
                except ValueError:
                    whole = False  # written while we copied (a new IDENTIFY): the next snapshot has it
        self._idents[w] = out
        return {uid: v[1] for uid, v in out.items()}, whole


def _signal_worker(board, w):
    """Wake worker w with STATS_WAKE_SIGNAL (only the process the board names, checked by its start time)."""
    if writer_alive(board, w):
        try:
            os.kill(board.word(w, B_PID), STATS_WAKE_SIGNAL)
        except OSError:
            pass  # gone meanwhile, or another user's: the worker's next tick answers


def _e2e_of(e2e, uids):
    """The e2e_processing_latency dicts of these rows, in order (nsqd's empty one for all without the flag)."""
    return [e2e.get(u, _E2E) for u in uids.tolist()] if e2e else itertools.repeat(_E2E)


def _e2e_marks(uids, parents, marks):
    """Per uid, the E2E mark of its parent entry (``_e2e_dicts``), 0 for one without E2E rows."""
    if not len(uids):
        return 0
    at = np.minimum(np.searchsorted(parents, uids), len(parents) - 1)
    return np.where(parents[at] == uids, marks[at], 0)


def _topic_key(t):
    return t["topic_name"]


def _topic_of(p):
    return p["topic"]


def _client_key(c):
    return (c["connect_ts"], c["remote_address"])


def _decode_name(row) -> str:
    n = int(row[_AUX])
    return row[_NAME:_NAME + NAME_WORDS].tobytes()[:n].decode("utf-8", "replace")


_NO_IDENTITY = {}


def _client(ident, c, pub_counts, worker):
    """ClientStats in NSQ 1.3.0's key order (omitempty keys only when set)."""
    i = ident if ident is not None else _NO_IDENTITY
    d = {"client_id": i.get("client_id", ""), "hostname": i.get("hostname", ""), "version": "V2",
         "remote_address": i.get("remote_address", ""), "state": c[K_STATE], "ready_count": c[K_READY],
         "in_flight_count": c[K_IN_FLIGHT], "message_count": c[K_MESSAGES], "finish_count": c[K_FINISHED],
         "requeue_count": c[K_REQUEUED], "connect_ts": i.get("connect_ts", 0), "sample_rate": i.get("sample_rate", 0),
         "deflate": i.get("deflate", False), "snappy": i.get("snappy", False), "user_agent": i.get("user_agent", "")}
    if i.get("authed"):
        d["authed"] = True
        if i.get("auth_identity"):
            d["auth_identity"] = i["auth_identity"]
        if i.get("auth_identity_url"):
            d["auth_identity_url"] = i["auth_identity_url"]
    if pub_counts:
        d["pub_counts"] = pub_counts
    d["tls"] = i.get("tls", False)
    d["tls_cipher_suite"] = i.get("tls_cipher_suite", "")
    d["tls_version"] = i.get("tls_version", "")
    d["tls_negotiated_protocol"] = i.get("tls_negotiated_protocol", "")
    d["tls_negotiated_protocol_is_mutual"] = i.get("tls_negotiated_protocol_is_mutual", False)
    if worker is not None:
        for k in ("output_buffer_size", "output_buffer_timeout", "heartbeat_interval", "msg_timeout"):
            d[k] = i.get(k, 0)
        d["worker"] = worker
    return d
