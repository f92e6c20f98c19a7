"""Shared memory of a dead instance: another nsqd's start says so in one short line, ``nsqd --leftovers`` names
the instance with its size and the data path and node id that recover it, ``nsqd --discard-leftovers`` removes it
(and refuses a running instance's)."""
import os
import subprocess
import sys

from nsqpy.ipc.shm import instance_prefix
from nsqpy.protocol import client as C
from tests.broker.wire import Conn, unique
from tests.logged_process import group_pids
from tests.polling import wait_until

NSQD = [sys.executable, "-m", "nsqpy.workers.processes.nsqd"]


def _run(*flags):
    done = subprocess.run([*NSQD, *flags], capture_output=True, text=True, timeout=120)
    return done.returncode, (done.stdout + done.stderr).strip()


def test_list_and_discard_what_a_dead_instance_left(nsqd_factory):
    # two workers: the messages are in the topic's log, or still in a pub ring when the OK came from a worker that
    # forwarded them (its owner may not have created the log yet): either way "may hold messages"
    dead = nsqd_factory(node_id=5, workers=2)
    with Conn(dead.address) as p:
        p.send(C.mpub(unique(), [b"a", b"b"]))
        p.expect_response(b"OK")
    dead.kill_all()  # a whole-broker crash: its messages stay in /dev/shm
    wait_until(lambda: not group_pids(dead.proc.pid), timeout=30, what="the crashed broker's processes reaped")
    tag = instance_prefix(dead.data_path, 5).strip("/-")
    assert dead.segments_left()
    code, out = _run("--leftovers")
    assert code == 0
    mine = [line for line in out.splitlines() if line.startswith(tag)]
    assert len(mine) == 1, out
    assert "may hold messages" in mine[0] and " MiB" in mine[0], mine
    assert f"recovered by: nsqd --data-path={os.path.realpath(dead.data_path)} --node-id=5" in mine[0], mine
    alive = nsqd_factory(node_id=6)
    said = [line for line in alive.output().splitlines() if "--leftovers" in line]
    assert len(said) == 1 and "dead nsqd instance" in said[0] and tag not in said[0], said  # one short line
    code, out = _run(f"--discard-leftovers={instance_prefix(alive.data_path, 6).strip('/-')}")
    assert code == 1 and "running nsqd" in out, out
    assert alive.segments_left()
    code, out = _run(f"--discard-leftovers={tag}")
    assert code == 0 and out.startswith(f"discarded {tag}: ") and "lost" in out, out
    assert not dead.segments_left()
    assert not os.path.exists(f"/dev/shm/{tag.replace('-', '-where-')}")
    code, out = _run(f"--discard-leftovers={tag}")
    assert code == 1 and "no leftover" in out, out
