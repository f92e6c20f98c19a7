"""Many workers on a small machine: shared memory is O(workers) and small when idle, and 64 workers deliver.

* The idle footprint is what ``nsqpy.workers.processes.plan.idle_shm_bytes`` predicts (ARCHITECTURE.md, "Shared memory per
  broker"): exactly, segment kind by segment kind, for a Plan created in this process; and for real brokers
  with --workers 2, 8 and 32 (allocated blocks of their /dev/shm files, as benchmarks/topic_cost.py counts them),
  where the links segment may also hold the first pages of each worker's timer ring (a worker that started
  before the scanner sends it a RESET right away). 32 workers must stay under 512 MiB (the rings alone took
  31.5 GiB when every pair's 32 MiB ring was reserved up front).
* ``--workers 64`` starts on this 2-core machine, and messages published on one connection to topics owned by
  many different workers (so forwarded through the rings) are all delivered to consumers on other connections.
"""
import os

import pytest

from nsqpy.ipc.ring import RESERVE_STEP
from nsqpy.ipc.shm import instance_prefix
from nsqpy.config import NsqdOptions
from nsqpy.log import Logger
from nsqpy.protocol import client as C
from wire import Conn, consumer, unique
from nsqpy.workers.processes.plan import Plan, idle_shm_bytes
from nsqpy.workers.publishing.records import owner_of

MIB = 1 << 20


def shm_by_kind(data_path, node_id):
    """{segment kind: allocated bytes} of one broker instance's /dev/shm files (kind: the name without the
    instance prefix and the index)."""
    prefix = instance_prefix(data_path, node_id).lstrip("/")
    out = {}
    with os.scandir("/dev/shm") as it:
        for e in it:
            if e.name.startswith(prefix):
                kind = e.name[len(prefix):].rsplit("-", 1)[0]
                try:
                    out[kind] = out.get(kind, 0) + e.stat(follow_symlinks=False).st_blocks * 512
                except FileNotFoundError:
                    pass
    return out


def test_a_plan_reserves_exactly_what_the_formula_says(tmp_path):
    opts = NsqdOptions.parse([f"--data-path={tmp_path}", "--workers=5", "--node-id=991"])
    plan = Plan(opts, Logger("[test] ", "error"))
    try:
        plan.create()
        assert shm_by_kind(str(tmp_path), 991) == idle_shm_bytes(5)
    finally:
        plan.destroy()
        for fd in plan.link_set.eventfds if plan.link_set else ():
            os.close(fd)
        for a, b in plan.inboxes:
            a.close()
            b.close()


@pytest.mark.parametrize("workers", [2, 8, 32])
def test_idle_shared_memory_matches_the_formula(nsqd_factory, workers):
    n = nsqd_factory(workers=workers)
    got = shm_by_kind(n.data_path, n.node_id)
    want = idle_shm_bytes(workers)
    assert set(got) == set(want), f"segment kinds {sorted(got)}, the formula knows {sorted(want)}"
    for kind in want:
        if kind == "links":  # plus the first page run of each worker's timer ring, if it wrote one already
            assert want[kind] <= got[kind] <= want[kind] + workers * RESERVE_STEP, (kind, got, want)
        else:
            assert got[kind] == want[kind], (kind, got, want)
    if workers == 32:
        assert sum(got.values()) < 512 * MIB


def test_64_workers_deliver_every_message(nsqd_factory):
    n = nsqd_factory(workers=64)
    topics = [unique("scale") for _ in range(24)]
    owners = {owner_of(t, 64) for t in topics}
    assert len(owners) >= 12, owners  # many owners, most of them not the publisher's worker
    sent = {t: [b"%s-%d" % (t.encode(), i) for i in range(40)] for t in topics}
    with Conn(n.address) as p:
        for t in topics:
            bodies = sent[t]
            p.send(C.mpub(t, bodies[:30]), *[C.pub(t, b) for b in bodies[30:]])
            for _ in range(11):
                p.expect_response(b"OK", timeout=60)
    for t in topics:
        with consumer(n.address, t, "ch", rdy=100) as c:
            got = [c.read_message(timeout=60) for _ in range(len(sent[t]))]
            c.send(*[C.fin(m.id) for m in got])
            assert sorted(m.body for m in got) == sorted(sent[t]), t
            c.expect_no_frame(0.2)  # nothing twice
