"""Where numba's ``cache=True`` writes compiled kernels; configured once, before any kernel module is imported.

Theory of operation
-------------------
numba keys a cached kernel on its own source file's path and content only, so editing ``ipc/atomics.py`` would leave
a stale ``ring.py`` kernel (which inlines the atomics) in the cache, and numba fails when the package directory is
read-only (a system install). So every kernel module of ours imports ``ipc`` first, whose ``__init__`` calls
``configure()``: it points ``NUMBA_CACHE_DIR`` at

    $XDG_CACHE_HOME/nsqpy/<nsqpy version>-py<major.minor>-numba<version>-<hash of our sources>

(``~/.cache`` when XDG_CACHE_HOME is unset). The hash covers every ``*.py`` file under the source roots (``ipc/``
and its siblings ``nsqpy/`` and ``workers/``), so any edit there starts a fresh directory instead of reusing stale
code. Not only the kernels' own files: numba freezes the value of every global a kernel reads into its machine
code, and keys a cached kernel on its own file's content only, so a constant a kernel imports from a module
without kernels (``nsqpy.workers.domain.session.FIN_LINE``, ``nsqpy.protocol.states``) would otherwise stay at its old value
in every cached kernel that uses it.

The directory does not depend on where the code lives, so a reinstall anywhere (a new virtualenv, a release
directory per deploy, a second checkout) of the same sources finds the kernels a first start compiled. numba
itself files each kernel under a hash of its source file's absolute directory, so ``configure()`` also puts
``SourceTreeLocator`` first in numba's list of cache locators: it files a kernel of ours under its package path
inside the chosen directory (``workers``, ``nsqpy_protocol``), stamped by the source file's content hash (as
numba 0.68's own locators are), not by its mtime, which a reinstall changes. Kernels outside our source roots (a
test's), an operator's ``NUMBA_CACHE_DIR`` and an operator's ``NUMBA_CACHE_LOCATOR_CLASSES`` keep numba's
locators.

If the chosen directory cannot be created or written, a per-user directory under the system temp dir is tried;
if that fails too, ``CACHE_ENABLED`` is False and ``CACHE_DIR`` None: kernels written as
``@njit(cache=KERNEL_CACHE, ...)`` then compile in memory only, while ``cache=True`` kernels keep working through
the temp-dir fallback, which only a machine without any writable directory lacks.

An explicit ``NUMBA_CACHE_DIR`` in the environment wins (an operator's choice); this is the one place below an
entry point that reads the environment, because numba itself reads it at import time. configure() exports its
choice (numba re-reads the environment when it compiles), and a program started from such a process inherits
it: ``NSQPY_NUMBA_CACHE_CHOSEN`` says it was ours, so that program chooses again, for its own sources (another
checkout's, a reinstall's), instead of taking it for an operator's.

Every edit, upgrade or second checkout leaves a directory of a few MB behind, so ``prune`` (called by a first
start's warm-up) removes the sibling directories of ours that no start used for PRUNE_AFTER_S: the newest of a
directory's own time and its warm-up mark's, which every start touches (``workers/lane/warmup.py``). Only a directory
this module chose is pruned around, never around an operator's ``NUMBA_CACHE_DIR``.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

from numba.core.caching import _CacheLocator  # the base of numba's cache locators

__all__ = ["configure", "CACHE_DIR", "CACHE_ENABLED", "KERNEL_CACHE", "JIT", "JIT_CALLEE", "warm_up_step", "source_roots",
           "SourceTreeLocator"]

# numba.njit's options for every kernel of ours (`@njit(..., **JIT)`): cached (above), and without the C-callable
# wrapper numba otherwise builds for each one (for first-class function values, which no kernel of ours is).
# JIT_CALLEE is for a kernel that only other kernels call: without the CPython wrapper (argument unboxing, the
# return value's boxing) either. Each wrapper is a separate piece of LLVM IR to optimise and compile, a large
# share of a small kernel's compile, which a first start pays for every kernel (ARCHITECTURE.md, "First start").
# Calling a JIT_CALLEE kernel from Python would jump through a missing wrapper and crash the process, so
# tests/workers/test_kernel_options.py fails when code outside a kernel names one.
JIT = dict(cache=True, no_cfunc_wrapper=True)
JIT_CALLEE = dict(JIT, no_cpython_wrapper=True)


def warm_up_step(fn=None, *, shm=False, waits_for=(), deferred=None):
    """Declare ``fn`` a warm-up step of its module, next to the kernels it compiles: called before the broker forks
    (``workers/lane/warmup.py`` collects every kernel module's ``WARM_UP`` list, which this appends to, and only
    schedules them), it compiles or loads that module's kernels by driving them with the argument types the broker
    passes. ``shm``: fn takes one argument, a shared-memory name prefix for throwaway segments. ``waits_for``: steps
    whose kernels fn's kernels call (when steps compile in parallel it waits for them, and loads theirs instead of
    compiling them again). ``deferred``: None (needed before nsqd listens), "lane" (the forward lane: compiled in
    the background on a first start, the workers switch the lane on once it is done) or "rare" (rare paths,
    compiled in the background on a first start, after the lane)."""
    def declare(f):
        f.warm_up_shm, f.warm_up_waits_for, f.warm_up_deferred = bool(shm), tuple(waits_for), deferred
        sys.modules[f.__module__].__dict__.setdefault("WARM_UP", []).append(f)
        return f
    return declare if fn is None else declare(fn)

CACHE_DIR: str | None = None
CACHE_ENABLED: bool = False
KERNEL_CACHE: bool = False
CHOSEN_HERE: bool = False  # CACHE_DIR is one of ours (not NUMBA_CACHE_DIR from the environment): prune may run
PRUNE_AFTER_S = 30 * 86400  # a sibling directory of ours that no start used for this long is removed (prune)
CHOSEN_ENV = "NSQPY_NUMBA_CACHE_CHOSEN"  # NUMBA_CACHE_DIR's value when configure() chose it (not an operator)
_LEAF = re.compile(r"^.+-py\d+\.\d+-numba[^-]+-[0-9a-f]{12}$")  # configure()'s directory names


@functools.lru_cache(maxsize=None)
def source_roots() -> tuple[tuple[str, Path], ...]:
    """(name, directory) of each package whose sources the cache covers: ``ipc`` (here), ``workers`` and ``nsqpy``,
    alike in a checkout (the three folders side by side at the top) and installed (``nsqpy/`` holding ``ipc/`` and
    ``workers/``, as setup.cfg's package_dir maps them)."""
    here = Path(__file__).resolve().parent
    top = here.parent  # a checkout: the repository; installed: site-packages/nsqpy
    nsqpy = top if (top / "__init__.py").is_file() else top / "nsqpy"
    return tuple((n, p) for n, p in (("ipc", here), ("workers", top / "workers"), ("nsqpy", nsqpy)) if p.is_dir())


_MAPPED = ("ipc", "workers", "http_api")  # installed inside nsqpy/: counted under their own names, or not at all


def _sources(roots):
    """(name, path) of every source file under ``roots``, named as in a checkout whatever the layout."""
    for name, root in roots:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            if name == "nsqpy" and rel.parts[0] in _MAPPED:
                continue
            yield f"{name}/{rel.as_posix()}", path


def _sources_hash(roots) -> str:
    digest = hashlib.blake2b(digest_size=6)
    for name, path in _sources(roots):
        try:
            text = path.read_bytes()
        except OSError:
            continue
        digest.update(name.encode() + b"\0" + text + b"\0")
    return digest.hexdigest()


def _package_version() -> str:
    try:
        from importlib.metadata import version
        return version("nsqpy")
    except Exception:  # not installed (running from a checkout)
        return "dev"


def _writable(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = tempfile.NamedTemporaryFile(dir=path, prefix=".probe-", delete=True)
        probe.close()
        return True
    except OSError:
        return False


def _candidates(leaf: str):
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    yield Path(base) / "nsqpy" / leaf
    yield Path(tempfile.gettempdir()) / f"nsqpy-numba-{os.getuid()}" / leaf


def configure() -> str | None:
    """Choose and install the cache directory; idempotent. Returns the directory, or None if caching is off."""
    global CACHE_DIR, CACHE_ENABLED, KERNEL_CACHE, CHOSEN_HERE
    if CACHE_DIR is not None or CACHE_ENABLED:
        return CACHE_DIR
    chosen = os.environ.get("NUMBA_CACHE_DIR")
    if chosen and chosen == os.environ.get(CHOSEN_ENV):
        chosen = None  # a parent's configure() exported it, not an operator: choose for these sources
    CHOSEN_HERE = not chosen
    if not chosen:
        import numba  # version only; compiling nothing
        leaf = "{}-py{}.{}-numba{}-{}".format(_package_version(), sys.version_info[0], sys.version_info[1],
                                             numba.__version__, _sources_hash(source_roots()))
        chosen = next((str(p) for p in _candidates(leaf) if _writable(p)), None)
    if chosen:
        os.environ["NUMBA_CACHE_DIR"] = chosen
        if CHOSEN_HERE:
            os.environ[CHOSEN_ENV] = chosen
        from numba.core import config
        config.CACHE_DIR = chosen  # numba read the environment when it was imported
        if CHOSEN_HERE:
            _locate_by_package()
    CACHE_DIR, CACHE_ENABLED = chosen, bool(chosen)
    KERNEL_CACHE = CACHE_ENABLED
    return CACHE_DIR


@functools.lru_cache(maxsize=None)
def _content_hash(path, mtime_ns, size):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _content_stamp(path):
    """A source file's content hash, computed once per (path, mtime, size)."""
    st = os.stat(path)
    return _content_hash(path, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=None)
def _package_subpath(py_file):
    """``nsqpy_protocol`` for .../nsqpy/protocol/states.py under one of our source roots; None elsewhere. Once
    per module, not once for each of its kernels (a warm start's imports create ~170; first_start_locator.json)."""
    path = Path(py_file).resolve()
    for name, root in source_roots():  # ipc and workers before nsqpy, which holds them when installed
        if path.is_relative_to(root):
            return "_".join((name, *path.parent.relative_to(root).parts))
    return None


class SourceTreeLocator(_CacheLocator):
    """numba's cache locator for a kernel of ours: its entries in CACHE_DIR/<package path>, stamped by the
    source file's content, so they do not depend on where the sources are installed (module docstring)."""

    def __init__(self, py_func, py_file, subpath):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(CACHE_DIR, subpath)

    def get_cache_path(self):
        return self._cache_path

    def get_source_stamp(self):
        return _content_stamp(self._py_file)

    def get_disambiguator(self):
        return str(self._lineno)

    @classmethod
    def from_function(cls, py_func, py_file):
        if not (CHOSEN_HERE and CACHE_DIR):
            return None
        subpath = _package_subpath(py_file)
        if subpath is None:
            return None
        self = cls(py_func, py_file, subpath)
        return self if _directory_writable(self._cache_path) else None


@functools.lru_cache(maxsize=None)
def _directory_writable(path: str) -> bool:
    """``_writable`` once per directory and process: a locator is made for each kernel at import."""
    return _writable(Path(path))


def _locate_by_package():
    """Put SourceTreeLocator before numba's own locators. An operator's list (NUMBA_CACHE_LOCATOR_CLASSES) still
    wins: numba reads this class list only when that setting is empty. Not through that setting itself: numba
    re-reads it from the environment at its next compile (so it would have to be exported, to every child)."""
    from numba.core import caching
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl  # older numba: a private name
    if SourceTreeLocator not in impl._locator_classes:
        impl._locator_classes.insert(0, SourceTreeLocator)


def last_used(path: Path, mark: str) -> float:
    """The newest of the directory's modification time and its ``mark`` file's (0 if the directory is gone)."""
    times = []
    for p in (path, path / mark):
        try:
            times.append(p.stat().st_mtime)
        except OSError:
            pass
    return max(times, default=0.0)


def prune(mark: str, older_than_s: float = PRUNE_AFTER_S, now: float | None = None) -> list[str]:
    """Remove the siblings of CACHE_DIR named as configure() names them whose ``last_used`` is older than
    ``older_than_s``; -> the paths removed. Nothing when CACHE_DIR is not one this module chose."""
    if not CHOSEN_HERE or not CACHE_DIR:
        return []
    now = time.time() if now is None else now
    here = Path(CACHE_DIR)
    removed = []
    try:
        siblings = [p for p in here.parent.iterdir() if p != here and p.is_dir() and _LEAF.match(p.name)]
    except OSError:
        return []
    for p in siblings:
        if now - last_used(p, mark) > older_than_s:
            shutil.rmtree(p, ignore_errors=True)
            removed.append(str(p))
    return removed
