"""A warm start loads every kernel from numba's cache without the refresh numba does first (importing its library
of implementations and filling its typing and lowering registries: ``warmup.load_without_registries``), the loaded
kernels run, and a kernel missing from the cache still compiles.

Each probe runs in a fresh interpreter: numba fills its registries once per process, so only a process that has
not compiled or loaded anything yet shows whether a load fills them.
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

COUNT_REFRESHES = """
import numba.core.base, numba.core.typing.context
refreshes = []
for cls in (numba.core.base.BaseContext, numba.core.typing.context.BaseContext):
    def counted(self, _refresh=cls.refresh, _name=cls.__module__):
        refreshes.append(_name)
        return _refresh(self)
    cls.refresh = counted
"""

WARM_UP = COUNT_REFRESHES + """
import os
from nsqpy.workers.lane import warmup
assert warmup.warm_up(f"nsqpy-loadprobe-{os.getpid()}-", defer=False) is None
print("cold" if warmup.cache_is_cold() else "warm", len(refreshes))
"""


def _run(code, env=None, cwd=ROOT):
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_warm_start_loads_every_kernel_without_refreshing_numbas_registries():
    # nsqd's own cache directory (ipc/numba_cache.py): the first run fills it if no broker of this checkout has
    first = _run(WARM_UP)
    assert first[0] == "warm"
    second = _run(WARM_UP)
    assert second == ["warm", "0"]


KERNEL = textwrap.dedent("""
    import numpy as np
    from numba import njit

    @njit(cache=True)
    def kernel(a, key):
        return a.sum() * 2 + len(key) + (hash(key) != 0)
""")

CALL = COUNT_REFRESHES + """
import numpy as np
from nsqpy.workers.lane.warmup import load_without_registries
load_without_registries()
from probe_kernel import kernel
result = kernel(np.arange(10, dtype=np.int64), "abc")
print(result, len(refreshes), sum(kernel.stats.cache_hits.values()))
"""


def test_a_missing_kernel_compiles_and_a_cached_one_loads_and_runs(tmp_path):
    (tmp_path / "probe_kernel.py").write_text(KERNEL)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")
    compiled = _run(CALL, env)
    assert compiled[0] == "94" and int(compiled[1]) > 0 and compiled[2] == "0"  # a compile refreshes as always
    loaded = _run(CALL, env)
    assert loaded == ["94", "0", "1"]  # from the cache, nothing refreshed, and it runs
