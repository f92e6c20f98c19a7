"""nsqpy.ipc.numba_cache: a versioned cache directory, a read-only fallback, and cached kernels that really load.

Each case runs a fresh interpreter, because the directory is chosen once per process, before numba compiles.
"""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = ("import nsqpy.ipc.numba_cache as c, numba.core.config as k; from nsqpy.ipc.ring import Ring; import mmap; "
         "r = Ring.create(mmap.mmap(-1, Ring.size_for(64)), 0, 64); r.write(b'x'); "
         "from nsqpy.ipc.ring import ring_try_write as f; print(c.CACHE_DIR); print(k.CACHE_DIR); print(len(f.stats.cache_hits))")


def probe(tmp_path, root=ROOT, **env):
    clean = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    clean.update(HOME=str(tmp_path / "home"), PYTHONPATH=str(root), TMPDIR=str(tmp_path / "tmp"), **env)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    out = subprocess.run([sys.executable, "-c", PROBE], env=clean, cwd=root, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def _install(site):
    """A copy of our source roots in ``site``, as an install there would have them (no bytecode)."""
    for package in ("ipc", "nsqpy", "workers"):
        shutil.copytree(ROOT / package, site / package, ignore=shutil.ignore_patterns("__pycache__"))
    return site


def test_versioned_directory_under_xdg_cache_home_and_reused(tmp_path):
    chosen, numba_sees, hits = probe(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert chosen == numba_sees and chosen.startswith(str(tmp_path / "xdg" / "nsqpy"))
    leaf = Path(chosen).name
    assert f"py{sys.version_info[0]}.{sys.version_info[1]}-numba" in leaf
    assert hits == "0"
    again = probe(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert again[0] == chosen and int(again[2]) > 0  # second process loads the kernels from the cache


def test_a_reinstall_in_place_keeps_the_cache(tmp_path):
    """pip writes every file anew (new mtimes, same content): the same directory, and numba's entries still load
    (it stamps a kernel's source by its content)."""
    installed = _install(tmp_path / "site")
    first = probe(tmp_path, installed, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    later = time.time() + 3600
    for path in installed.rglob("*.py"):
        os.utime(path, (later, later))
    again = probe(tmp_path, installed, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert again[0] == first[0] and first[2] == "0" and int(again[2]) > 0


def test_a_reinstall_elsewhere_loads_the_kernels_a_first_install_compiled(tmp_path):
    """A new virtualenv or release directory with the same sources: the same directory, whose entries load there
    (numba would file them under the first install's absolute path)."""
    sites = [_install(tmp_path / name / "site-packages") for name in ("release-1", "release-2")]
    first = probe(tmp_path, sites[0], XDG_CACHE_HOME=str(tmp_path / "xdg"))
    again = probe(tmp_path, sites[1], XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert again[0] == first[0] and first[2] == "0" and int(again[2]) > 0
    entries = {p.parent.name for p in Path(first[0]).rglob("*.nbi")}
    assert entries == {"ipc"}  # filed by package path, not by either site's absolute path


def test_an_operators_locator_list_and_kernels_outside_our_sources_keep_numbas_locators(tmp_path):
    (tmp_path / "theirs.py").write_text("from numba import njit\n@njit(cache=True)\ndef f(x):\n    return x + 1\n")
    code = ("import ipc, theirs; from nsqpy.ipc.ring import ring_try_write as ours; theirs.f(1); "
            "print(ours._cache._cache_path); print(theirs.f._cache._cache_path)")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               PYTHONPATH=f"{ROOT}:{tmp_path}")
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    ours, theirs = map(Path, out.stdout.split())
    assert ours.name == "ipc" and theirs.parent == ours.parent
    assert theirs.name.startswith(f"{tmp_path.name}_")  # numba's: the source directory's name and a hash of it
    env["NUMBA_CACHE_LOCATOR_CLASSES"] = "numba.core.caching.UserProvidedCacheLocator"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.split()[0]).name.startswith("ipc_")  # numba's locator for ours too


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
    # one exported by another process's configure() (this suite's, nsqd's) is not an operator's: chosen again
    chosen, _, _ = probe(tmp_path, NUMBA_CACHE_DIR=str(tmp_path / "theirs"),
                         NSQPY_NUMBA_CACHE_CHOSEN=str(tmp_path / "theirs"), XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert chosen.startswith(str(tmp_path / "xdg" / "nsqpy"))


def _tree(base, kernel_text):
    for sub in ("ipc", "workers"):
        (base / sub).mkdir(parents=True)
    (base / "ipc" / "ring.py").write_text("from numba import njit\n")
    (base / "workers" / "pump.py").write_text(kernel_text)
    return [("ipc", base / "ipc"), ("workers", base / "workers")]


def test_the_directory_changes_with_any_source_edit_but_not_with_the_code_location(tmp_path):
    from nsqpy.ipc.numba_cache import _sources_hash, source_roots
    assert {name for name, _ in source_roots()} == {"ipc", "nsqpy", "workers"}
    a = _sources_hash(_tree(tmp_path / "a", "import numba\nK = 1\n"))
    assert a == _sources_hash([("ipc", tmp_path / "a" / "ipc"), ("workers", tmp_path / "a" / "workers")])  # stable for one tree
    (tmp_path / "a" / "workers" / "pump.py").write_text("import numba\nK = 2\n")
    assert _sources_hash([("ipc", tmp_path / "a" / "ipc"), ("workers", tmp_path / "a" / "workers")]) != a  # a kernel edit in workers/
    # a constant in a module without kernels: a kernel that imports it has its old value frozen in its machine code
    k = _sources_hash([("ipc", tmp_path / "a" / "ipc"), ("workers", tmp_path / "a" / "workers")])
    (tmp_path / "a" / "workers" / "session.py").write_text("FIN_LINE = 21\n")
    assert _sources_hash([("ipc", tmp_path / "a" / "ipc"), ("workers", tmp_path / "a" / "workers")]) != k
    # the same sources elsewhere (another checkout or venv): the same directory (SourceTreeLocator)
    b = _sources_hash(_tree(tmp_path / "b", "import numba\nK = 2\n"))
    (tmp_path / "b" / "workers" / "session.py").write_text("FIN_LINE = 21\n")
    assert b == k


def _aged(path, days, now):
    path.mkdir(parents=True, exist_ok=True)
    os.utime(path, (now - days * 86400, now - days * 86400))
    return path


def test_prune_removes_only_our_sibling_directories_unused_for_a_month(tmp_path, monkeypatch):
    """Unused: the newer of the directory's time and its warm-up mark's (every start touches the mark)."""
    from nsqpy.ipc import numba_cache as c
    now = time.time()
    base = tmp_path / "nsqpy"
    here = _aged(base / "0.2.0-py3.11-numba0.68.1-aaaaaaaaaaaa", 90, now)  # the one in use: never removed
    stale = _aged(base / "0.1.0-py3.11-numba0.68.1-0123456789ab", 31, now)
    recent = _aged(base / "0.1.0-py3.11-numba0.68.1-ba9876543210", 29, now)
    used = _aged(base / "dev-py3.11-numba0.68.1-cccccccccccc", 90, now)
    (used / ".mark").touch()  # touched by a start now: its directory's own time is old
    _aged(used, 90, now)
    foreign = _aged(base / "notes", 90, now)  # not a name configure() gives
    monkeypatch.setattr(c, "CACHE_DIR", str(here))
    monkeypatch.setattr(c, "CHOSEN_HERE", True)
    assert c.prune(".mark", now=now) == [str(stale)]
    assert sorted(p.name for p in base.iterdir()) == sorted(p.name for p in (here, recent, used, foreign))
    monkeypatch.setattr(c, "CHOSEN_HERE", False)  # an operator's NUMBA_CACHE_DIR: nothing around it is ours
    assert c.prune(".mark", older_than_s=0, now=now) == []
