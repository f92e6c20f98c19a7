"""ipc.numba_cache: a versioned cache directory, a read-only fallback, and cached kernels that really load.

Each case runs a fresh interpreter, because the directory is chosen once per process, before numba compiles.
"""
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import ipc.numba_cache as c, numba.core.config as k; from ipc.ring import Ring; import mmap; "
         "r = Ring.create(mmap.mmap(-1, Ring.size_for(64)), 0, 64); r.write(b'x'); "
         "from ipc.ring import ring_try_write as f; print(c.CACHE_DIR); print(k.CACHE_DIR); print(len(f.stats.cache_hits))")


def probe(tmp_path, **env):
    clean = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    clean.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path / "tmp"), **env)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    out = subprocess.run([sys.executable, "-c", PROBE], env=clean, cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_versioned_directory_under_xdg_cache_home_and_reused(tmp_path):
    chosen, numba_sees, hits = probe(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert chosen == numba_sees and chosen.startswith(str(tmp_path / "xdg" / "nsqpy"))
    leaf = Path(chosen).name
    assert f"py{sys.version_info[0]}.{sys.version_info[1]}-numba" in leaf
    assert hits == "0"
    again = probe(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert again[0] == chosen and int(again[2]) > 0  # second process loads the kernels from the cache


def test_read_only_cache_home_falls_back_to_a_per_user_temp_dir(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):  # root ignores permissions: make the path unusable instead
            ro.chmod(0o700)
            (ro / "nsqpy").write_text("a file where the cache directory would go")
        chosen, numba_sees, _ = probe(tmp_path, XDG_CACHE_HOME=str(ro))
    finally:
        ro.chmod(0o700)
    assert chosen == numba_sees and chosen.startswith(str(tmp_path / "tmp" / f"nsqpy-numba-{os.getuid()}"))


def test_an_explicit_numba_cache_dir_wins(tmp_path):
    chosen, numba_sees, _ = probe(tmp_path, NUMBA_CACHE_DIR=str(tmp_path / "mine"))
    assert chosen == numba_sees == str(tmp_path / "mine")
