"""The stats reader's reuse of what it built before (nsqpy/broker/stats.py) never shows anything a fresh reader
would not: random changes to the rows of two writers (topics and channels coming and going, counters moving,
consumers and producers connecting, re-identifying, publishing, leaving), and after each batch the long-lived
reader's snapshot, with and without filters, must equal the first snapshot of a reader that has seen nothing.

The rows are written with the worker's own schema helpers, as ``workers/domain/stats_rows.py`` writes them, without a broker.
"""
import json
import mmap
import os
import random

import numpy as np
import pytest

from nsqpy.ipc.shm import list_segments
from nsqpy.ipc.statrows import Board, RowWriter
from nsqpy.broker.stats import (KIND_CHANNEL, KIND_CLIENT, KIND_E2E, KIND_PUB, KIND_TEXT, KIND_TOPIC, StatsReader,
                                e2e_counters, encode_e2e, encode_name, encode_text)
from nsqpy.workers.domain.stats_rows import _body


class Writer:
    """One worker's rows, changed at random (a model of what workers/domain/stats_rows.py does)."""

    def __init__(self, board, w, name_of, rng):
        self.rows = RowWriter(board, w, lambda gen: name_of(w, gen))
        self.rng = rng
        self.topics = {}    # name -> [idx, uid, counters, {channel: [idx, uid, counters]}]
        self.clients = {}   # key -> {"idx", "uid", "counters", "ver", "text", "pubs": {topic: [idx, n]}}
        self.w = w
        self.seq = 0
        self.e2e = {}       # topic or channel uid -> its E2E rows (--e2e-processing-latency-percentile)

    def _counters(self, n):
        return tuple(self.rng.randint(0, 50) for _ in range(n))

    def step(self):
        rng, rows = self.rng, self.rows
        op = rng.random()
        if op < 0.12 or not self.topics:
            name = f"t{self.w}-{rng.randint(0, 60)}"
            if name not in self.topics:
                c = self._counters(5)
                idx, uid = rows.create(KIND_TOPIC, _body(0, encode_name(name), c))
                self.topics[name] = [idx, uid, c, {}]
        elif op < 0.16:
            name = rng.choice(list(self.topics))
            t = self.topics.pop(name)
            for ch in t[3].values():
                rows.free(ch[0])
                self._drop_e2e(ch[1])
            rows.free(t[0])
            self._drop_e2e(t[1])
            for cl in self.clients.values():
                if cl["channel"] in {ch[1] for ch in t[3].values()}:
                    cl["channel"] = 0
                    self._update_client(cl)
        elif op < 0.30:
            t = self.topics[rng.choice(list(self.topics))]
            name = rng.choice("abcdefgh")
            if name not in t[3]:
                c = self._counters(8)
                idx, uid = rows.create(KIND_CHANNEL, _body(t[1], encode_name(name), c))
                t[3][name] = [idx, uid, c]
            else:
                ch = t[3].pop(name)
                rows.free(ch[0])
                self._drop_e2e(ch[1])
        elif op < 0.55:
            t = self.topics[rng.choice(list(self.topics))]
            target = t if not t[3] or rng.random() < 0.3 else t[3][rng.choice(list(t[3]))]
            if rng.random() < 0.3:  # its end-to-end latency rows: created, or new numbers (one or two parts)
                n = 3 + 8 * (self.w == 1)
                result = (rng.randint(0, 50), tuple(rng.randint(0, 10**9) for _ in range(n)))
                idxs = self.e2e.get(target[1])
                if idxs is None:
                    quantiles = [round(1 - k / 20, 2) for k in range(n)]
                    self.e2e[target[1]] = [rows.create(KIND_E2E, _body(target[1], named, c))[0]
                                           for named, c in zip(encode_e2e(quantiles), e2e_counters(*result))]
                else:
                    for idx, c in zip(idxs, e2e_counters(*result)):
                        rows.update(idx, c)
            else:
                target[2] = self._counters(5 if target is t else 8)
                rows.update(target[0], target[2])
        elif op < 0.65 or not self.clients:
            self.seq += 1
            channels = [ch[1] for t in self.topics.values() for ch in t[3].values()]
            cl = {"channel": rng.choice(channels) if channels and rng.random() < 0.6 else 0, "ver": 1,
                  "pubs": {}, "counters": self._counters(6)}
            idx, cl["uid"] = rows.create(KIND_CLIENT, _body(0, [], (0,) * 9))
            cl["idx"] = idx
            self._identify(cl)
            self.clients[self.seq] = cl
        elif op < 0.72:
            cl = self.clients.pop(rng.choice(list(self.clients)))
            for idx in [cl["idx"]] + cl["text"] + [p[0] for p in cl["pubs"].values()]:
                rows.free(idx)
        elif op < 0.77:
            cl = self.clients[rng.choice(list(self.clients))]
            old = cl["text"]
            cl["ver"] += 1
            self._identify(cl)
            for idx in old:
                rows.free(idx)
        elif op < 0.9:
            cl = self.clients[rng.choice(list(self.clients))]
            topic = rng.choice(list(self.topics))
            p = cl["pubs"].get(topic)
            if p is None:
                idx, _ = rows.create(KIND_PUB, _body(cl["uid"], encode_name(topic), (1,)))
                cl["pubs"][topic] = [idx, 1]
            else:
                p[1] += rng.randint(1, 9)
                rows.update(p[0], (p[1],))
        else:
            cl = self.clients[rng.choice(list(self.clients))]
            cl["counters"] = self._counters(6)
            self._update_client(cl)

    def _drop_e2e(self, uid):
        for idx in self.e2e.pop(uid, ()):
            self.rows.free(idx)

    def _identify(self, cl):
        ident = {"client_id": f"c{self.w}-{cl['uid'] & 0xFFFF}-v{cl['ver']}",
                 "hostname": "h" * self.rng.randint(1, 400),  # one to several TEXT rows
                 "user_agent": "ua", "remote_address": f"10.0.0.{self.w}:{cl['uid'] & 0xFFFF}", "connect_ts": 5}
        data = json.dumps(ident).encode()
        cl["text"] = [self.rows.create(KIND_TEXT, b)[0] for b in encode_text(cl["uid"], cl["ver"], data)]
        cl["len"] = len(data)
        self._update_client(cl)

    def _update_client(self, cl):
        self.rows.update(cl["idx"], cl["counters"] + (cl["ver"], cl["len"], cl["channel"]))


@pytest.fixture
def plane(shm_prefix):
    board = Board.create(np.frombuffer(mmap.mmap(-1, Board.nbytes(2)), np.uint8), 2)
    yield board, lambda w, gen: f"/{shm_prefix}-stats{w}-{gen}"
    for name in list_segments("/" + shm_prefix):
        os.unlink("/dev/shm" + name)


FILTERS = [{}, {"include_clients": False}, {"topic": "t0-3"}, {"channel": "c"}, {"topic": "t1-5", "channel": "a"},
           {"nsqpy_fields": True}]


def snapshot(reader, **filters):
    return json.dumps(reader.stats(fresh=False, include_mem=False, **filters))


def one_round(board, name_of, rng, writers, reader, round_):
    """A batch of random changes, then the long-lived reader's snapshots against a new reader's."""
    for _ in range(rng.randint(0, 12)):
        rng.choice(writers).step()
    for wr in writers:
        wr.rows.flush()
    fresh = StatsReader(board, "", 0, name_of=name_of)
    try:
        assert snapshot(reader) == snapshot(fresh), round_
        filters = rng.choice(FILTERS)
        assert snapshot(reader, **filters) == snapshot(fresh, **filters), (round_, filters)
    finally:
        fresh.close()


@pytest.mark.parametrize("seed", [7, 8, 9])
def test_a_long_lived_reader_shows_what_a_new_one_shows(plane, seed):
    board, name_of = plane
    rng = random.Random(seed)
    writers = [Writer(board, w, name_of, rng) for w in range(2)]
    reader = StatsReader(board, "", 0, name_of=name_of)
    try:
        for round_ in range(400):
            one_round(board, name_of, rng, writers, reader, round_)
        shown = reader.stats(fresh=False, include_mem=False)
        assert shown["topics"] and shown["producers"]  # the model did make something to compare
        assert any(t["e2e_processing_latency"]["percentiles"] for t in shown["topics"]) and \
            any(c["e2e_processing_latency"]["percentiles"] for t in shown["topics"] for c in t["channels"])
    finally:
        reader.close()
        for wr in writers:
            wr.rows.close()
