"""The warm-up compiles every kernel the broker calls, and each once per real argument type, not again for a
literal constant.

Both run every warm-up step on an empty cache, in a fresh interpreter (numba reads its cache directory at import),
then look at every numba dispatcher of ours.

* **Every kernel.** A kernel the warm-up never compiles is compiled (first start) or loaded (later starts) by the
  worker, scanner or HTTP process that first needs it, while it serves: a stall of up to a second on a cold cache,
  in every such process. Such paths are rare by nature (a saved channel queue loaded at a worker's start, a topic
  emptied, a crashed worker's channels rewound), so traffic-driven tests do not reach them all
  (tests/broker/test_first_start.py drives the common ones). This fails on a kernel of ours that the warm-up's
  steps leave uncompiled, unless NOT_IN_BROKER says why no broker process calls it. Fix one with a call in a
  warm-up step (workers/lane/warmup.py), with the argument types its caller passes.
* **No literal copies.** numba compiles a callee separately for every distinct signature it is called with, and
  a constant argument (a literal ``0``, a module constant, or a loop variable on its first pass, before type
  inference widens it) is a distinct ``Literal[int]`` type. Each such copy is a full compile: on a cold cache (the
  first start after an install) they once added several seconds. This fails on any kernel of ours compiled twice
  for signatures that differ only in literalness. Fix one with a typed value (``np.int64(0)``,
  ``locals={...: int64}``) or, for a helper of a few lines, ``inline="always"``.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import gc, importlib, os, pkgutil
from numba.core import types
from numba.core.registry import CPUDispatcher
from nsqpy.workers.lane import warmup
for step in warmup._steps(f"nsqpy-sigprobe-{os.getpid()}-"):
    step()
import nsqpy, nsqpy.ipc, nsqpy.workers, nsqpy.http_api
# every kernel of ours, also in modules the warm-up does not import (a checkout's nsqpy.__path__ does not list the
# sub-packages that setup.cfg's package_dir maps from the top of the repository: each is walked on its own)
for pkg in (nsqpy, nsqpy.ipc, nsqpy.workers, nsqpy.http_api):
    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        importlib.import_module(m.name)
gc.unfreeze()  # nsqpy.workers.processes.nsqd freezes what is alive at its import: get_objects() would not list it
for d in gc.get_objects():
    if isinstance(d, CPUDispatcher) and d.py_func.__module__.split(".")[0] == "nsqpy":
        name = f"{d.py_func.__module__}.{d.py_func.__name__}"
        plain = {tuple(types.unliteral(a) for a in sig) for sig in d.signatures}
        if len(plain) < len(d.signatures):
            print(f"literal {name}: {[str(s) for s in d.signatures]}")
        if not d.signatures and d.targetoptions.get("inline") != "always":
            print(f"uncompiled {name}")
print("checked")
"""

# Kernels of ours that no broker process calls, so the warm-up leaves them alone.
NOT_IN_BROKER = {
    "nsqpy.ipc.atomics.py_cas": "no caller outside the atomics' tests",
    "nsqpy.ipc.heap.heap_pop": "TimerHeap.pop: tests (the scanner takes what is due with peek_and_shift)",
    "nsqpy.ipc.heap.heap_check": "TimerHeap.check: the tests' invariant check",
    "nsqpy.ipc.inflight.inflight_check": "InFlightTable.check: the tests' invariant check",
    "nsqpy.ipc.ring.ring_write_batch": "Ring.write_batch: tests (the broker writes a ring's records one by one)",
    "nsqpy.protocol.kernels.frame_messages": "frames.frame_message_batch: the benchmarks' source server, tests",
    "nsqpy.protocol.kernels.write_be": "called by frame_messages only",
    "nsqpy.protocol.kernels.decode_message_frames": "the client library, in its user's process",
}


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(NUMBA_CACHE_DIR=str(tmp_path_factory.mktemp("numba")), NUMBA_OPT="0",  # same signatures, faster
               PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "checked"
    return lines[:-1]


def test_no_kernel_compiles_a_literal_copy_of_a_signature(probe):
    assert [line for line in probe if line.startswith("literal ")] == []


def test_the_warm_up_compiles_every_kernel_a_broker_process_calls(probe):
    uncompiled = {line.split()[1] for line in probe if line.startswith("uncompiled ")}
    assert sorted(uncompiled - set(NOT_IN_BROKER)) == []
    assert sorted(set(NOT_IN_BROKER) - uncompiled) == []  # a kernel the warm-up compiles now leaves the list
