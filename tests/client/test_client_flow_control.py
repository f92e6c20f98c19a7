"""RdyPlanner and Backoff as pure state: tables of inputs and the RDY or action that must follow."""

import time

import pytest

from nsqpy.client import Config
from nsqpy.client.backoff import Backoff
from nsqpy.client.rdy import RdyPlanner


class FakeConn:
    def __init__(self, max_rdy_count=2500):
        self.rdy = 0
        self.sent = []
        self.closed = self.closing = False
        self.max_rdy_count = max_rdy_count
        self.last_message_at = self.last_rdy_at = time.monotonic()

    def send(self, data):
        self.sent.append(data)


@pytest.mark.parametrize("mif, conns, expected", [
    (1, 1, [1]), (10, 1, [10]), (10, 3, [3, 3, 3]), (2, 3, [1, 1, 0]), (0, 2, [0, 0]), (5000, 1, [2500]),
    (9, 2, [4, 4]),
])
def test_rdy_share_and_total(mif, conns, expected):
    planner = RdyPlanner(Config(max_in_flight=mif))
    cs = [FakeConn() for _ in range(conns)]
    planner.update_all(cs)
    assert [c.rdy for c in cs] == expected
    assert sum(c.rdy for c in cs) <= mif
    for c in cs:
        assert c.sent == ([b"RDY %d\n" % c.rdy] if c.rdy else [])


def test_redistribution_moves_rdy_from_idle_connections_and_keeps_the_total():
    planner = RdyPlanner(Config(max_in_flight=1, low_rdy_idle_timeout=0.0))
    cs = [FakeConn() for _ in range(3)]
    planner.update_all(cs)
    holders = set()
    for _ in range(200):
        planner.redistribute(cs, in_backoff=False)
        assert sum(c.rdy for c in cs) <= 1
        holders.update(i for i, c in enumerate(cs) if c.rdy)
    assert holders == {0, 1, 2}   # every connection gets its turn


def test_lowering_the_max_cuts_rdy_before_raising_others():
    planner = RdyPlanner(Config(max_in_flight=10))
    cs = [FakeConn(), FakeConn()]
    planner.update_all(cs)
    assert [c.rdy for c in cs] == [5, 5]
    planner.max_in_flight = 4
    planner.update_all(cs)
    assert [c.rdy for c in cs] == [2, 2]


@pytest.mark.parametrize("results, actions, level", [
    ([False], ["timeout"], 1),
    ([True], ["none"], 0),
    ([False, True], ["timeout", "resume"], 0),
    ([False, False, True], ["timeout", "timeout", "timeout"], 1),
    ([False] * 20, ["timeout"] * 20, 7),     # capped where 2^level reaches max_backoff_duration (128 s)
])
def test_backoff_transitions(results, actions, level):
    b = Backoff(1.0, 128.0)
    got = []
    for ok in results:
        got.append(b.on_result(ok))
    assert got == actions and b.level == level
    assert b.duration() == min(2 ** level, 128.0) or level == 0


def test_backoff_ignores_results_during_a_timeout():
    b = Backoff(1.0, 120.0)
    assert b.on_result(False) == "timeout"
    b.in_timeout = True
    assert b.on_result(False) == "none" and b.on_result(True) == "none" and b.level == 1
