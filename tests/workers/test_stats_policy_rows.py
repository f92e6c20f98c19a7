"""POLICY rows (nsqpy's policies, issue 49) in the stats reader's reuse: test_stats_reader's random model of two
writers, with channels' POLICY rows created, updated, freed and replaced (a new dead-letter name is a new row,
possibly with its predecessor's GEN); after each batch a long-lived reader's snapshot must equal a new reader's,
with and without filters, and a channel shows its policy fields exactly while it has a row."""
import json
import random

import pytest

from nsqpy.broker.stats import KIND_POLICY, POLICY_OVERFLOWS, StatsReader, encode_name
from nsqpy.workers.domain.stats_rows import _body
from tests.workers.test_stats_reader import Writer, one_round, plane, snapshot  # noqa: F401 (plane: a fixture)


class PolicyWriter(Writer):
    def __init__(self, *args):
        super().__init__(*args)
        self.policies = {}   # channel uid -> [row index, dead-letter name, counters]

    def step(self):
        rng = self.rng
        channels = [ch[1] for t in self.topics.values() for ch in t[3].values()]
        if not channels or rng.random() < 0.6:
            return super().step()
        uid = rng.choice(channels)
        p = self.policies.get(uid)
        op = rng.random()
        if p is None or op < 0.15:           # a new row: a first policy, or a new dead-letter name
            if p is not None:
                self.rows.free(p[0])
            name = rng.choice(["", "dlq", f"t{self.w}.dead", "graves"])
            counters = self._policy_counters()
            idx, _ = self.rows.create(KIND_POLICY, _body(uid, encode_name(name), counters))
            self.policies[uid] = [idx, name, counters]
        elif op < 0.3:                        # off and nothing counted: the row goes
            self.rows.free(self.policies.pop(uid)[0])
        else:                                 # counters moved, or the values changed
            p[2] = self._policy_counters()
            self.rows.update(p[0], p[2])

    def _policy_counters(self):
        rng = self.rng
        return (rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 5), rng.randint(0, 9000),
                rng.randint(0, 99), rng.randint(0, 1 << 20), rng.randrange(len(POLICY_OVERFLOWS)), rng.randint(0, 1))


@pytest.mark.parametrize("seed", [11, 12])
def test_a_long_lived_reader_shows_policies_as_a_new_one(plane, seed):  # noqa: F811
    board, name_of = plane
    rng = random.Random(seed)
    writers = [PolicyWriter(board, w, name_of, rng) for w in range(2)]
    reader = StatsReader(board, "", 0, name_of=name_of)
    seen_policy = seen_off = 0
    try:
        for round_ in range(300):
            one_round(board, name_of, rng, writers, reader, round_)
            shown = json.loads(snapshot(reader))
            for wr in writers:
                for t in wr.topics.values():
                    for name, (_, uid, _) in t[3].items():
                        [c] = [c for tt in shown["topics"] for c in tt["channels"]
                               if c["channel_name"] == name and tt["topic_name"] == _topic_name(wr, t)]
                        p = wr.policies.get(uid)
                        if p is None:
                            assert "dropped_count" not in c and "policy" not in c
                            continue
                        dead, expired, dropped, attempts, ttl, depth, nbytes, overflow, on = p[2]
                        assert (c["dead_lettered_count"], c["expired_count"], c["dropped_count"]) == \
                            (dead, expired, dropped)
                        if on:
                            seen_policy += 1
                            assert c["policy"] == {"max_attempts": attempts, "dead_letter_topic": p[1],
                                                   "message_ttl_ms": ttl, "max_depth": depth, "max_bytes": nbytes,
                                                   "overflow": POLICY_OVERFLOWS[overflow]}
                        else:
                            seen_off += 1
                            assert "policy" not in c
        assert seen_policy and seen_off   # the model did make both kinds
    finally:
        reader.close()
        for wr in writers:
            wr.rows.close()


def _topic_name(wr, t):
    return next(name for name, v in wr.topics.items() if v is t)
