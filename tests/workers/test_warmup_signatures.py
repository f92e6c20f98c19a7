"""The warm-up compiles each kernel once per real argument type, not again for a literal constant.

numba compiles a callee separately for every distinct signature it is called with, and a constant argument (a
literal ``0``, a module constant, or a loop variable on its first pass, before type inference widens it) is a
distinct ``Literal[int]`` type. Each such copy is a full compile: on a cold cache (the first start after an
install) they once added several seconds. This runs every warm-up step on an empty cache, in a fresh interpreter
(numba reads its cache directory at import), and fails on any kernel of ours compiled twice for signatures that
differ only in literalness. Fix one with a typed value (``np.int64(0)``, ``locals={...: int64}``) or, for a
helper of a few lines, ``inline="always"``.
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import gc, os
from numba.core import types
from numba.core.registry import CPUDispatcher
from workers import warmup
for step in warmup._steps(f"nsqpy-sigprobe-{os.getpid()}-"):
    step()
for d in gc.get_objects():
    if isinstance(d, CPUDispatcher) and d.py_func.__module__.split(".")[0] in ("ipc", "nsqpy", "workers"):
        plain = {tuple(types.unliteral(a) for a in sig) for sig in d.signatures}
        if len(plain) < len(d.signatures):
            print(f"{d.py_func.__module__}.{d.py_func.__name__}: {[str(s) for s in d.signatures]}")
print("checked")
"""


def test_no_kernel_compiles_a_literal_copy_of_a_signature(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(NUMBA_CACHE_DIR=str(tmp_path / "numba"), NUMBA_OPT="0", PYTHONPATH=str(ROOT))  # same signatures
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=ROOT, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "checked"
    assert lines[:-1] == []
