"""How long nsqd takes to listen on its first start after an install (numba's cache empty: every kernel compiles)
and on later starts (loaded from the cache), optionally next to another checkout (a commit before a change) and
Go nsqd.

    python -m benchmarks.first_start [--rounds=1] [--warm-starts=1] [--compile-only] [--go-nsqd=PATH] [--moved]
                                     [--workers=2] [--no-http] [--baseline-checkout=DIR] [--out=FILE]
    python -m benchmarks.first_start --steps[=I,J,...] [--out=FILE]

Each round gives each checkout a fresh XDG_CACHE_HOME (so a fresh numba cache: ipc/numba_cache.py): a cold start
fills it, then --warm-starts starts load from it. Each start gets a fresh data path; the time is from exec to the
`TCP: listening on` line. nsqd runs with its HTTP API on (port 0), as an operator's does, unless --no-http; then
`*_http_s` is the time from exec to the `HTTP: listening on` line (the same moment as TCP's for a checkout that
prints both once every child is ready). Checkouts alternate within a round (the cold starts, then each warm start),
so a drift in the machine's load hits both alike. Prints one JSON line (commit, cores, command, and
`load_average`: the 1-minute load average before and after the run). A cold round
costs some 30 s of CPU (more with --compile-only): the default is one round, on a machine others share.

`cold_full_speed_s`: exec to the last worker's `forward lane on` line (a first start compiles the forward lane in
the background after it listens; until then the workers serve on the loop's Python path): full speed. A warm start
has the lane from its first request.

--compile-only adds, per round and checkout, the install step README's commands can run before the first start:
`nsqd --compile-only` on another fresh cache (`compile_only_s`, exec to its exit; `compile_only_progress`, how many
`compiled k/N` lines it printed, `compile_only_first_line_s`, exec to its first, and `compile_only_cpu_s`, the CPU
time of it and its compiling processes: the figure a loaded machine changes least), then a start on the cache it
filled (`after_compile_only_s`): what a newcomer's first `nsqd` costs when the install step ran.

--go-nsqd=PATH adds a start of Go nsqd per round (`go`: `start_s`, exec to its `TCP: listening on` line, and
`http_s`), on a fresh data path, with the same listeners (port 0). Without it, or when PATH is not an executable
file, Go is skipped (the result says so in `go_skipped`).

--moved adds, after each round's warm starts, a start of a copy of each checkout's packages in another directory
(a reinstall elsewhere: a new virtualenv, a release directory per deploy) with that checkout's cache (`moved_s`).

nsqd runs with --log-level=debug, so each start is also split into phases (`runs[name]`, lists per round):
`*_hello_s`, exec to nsqd's first log line (the interpreter, importing numpy, numba and our modules, some
kernels loading at import, parsing the flags); `*_kernels_s`, the supervisor's warm-up as nsqd logs it (loading
every kernel from numba's cache; on a cold start, compiling them first); the rest of the total is salvage,
shared memory and starting the children until each is ready. A checkout whose nsqd does not log a phase has
no list for it.

--steps measures what a first start's compile costs on a host with more cores: each warm-up step
(workers/lane/warmup.py ``_steps``, or the indices given) compiles alone, in a process of its own with a fresh numba
cache (its imports are not counted). `steps` lists the seconds per step (a step the warm-up makes wait for others,
its declared ``waits_for`` through ``warmup.dependencies``, is timed after they ran in the same process: `waits`
lists their indices); `predicted_kernels_s` hands them out, but for the steps nsqd does not wait for (a
first start compiles ``warmup.DEFERRED`` in the background after it listens: ``deferred`` true), as the
warm-up's queue does to its compiling processes (each free process takes the next step in order, a waiting one
starting once those it waits for are done; P = min(steps, cores) processes) for P = 1, 2, 4, 16 and 64, and
takes when the last one finishes: the warm-up phase on a host with P cores as fast as this one's, if compiling
processes do not slow each other down. `predicted_all_steps_s` is the same with every step waited for (nsqd
before it deferred any).
Kernels that several steps share compile once per process that needs them, so the P = 1 figure overstates a
serial warm-up; P = 2 is the one to hold against this host's measured `cold_kernels_s`.

PYTHONDONTWRITEBYTECODE is removed from the started nsqd's environment (this workplace's shells set it): with it,
every start compiles our modules' source again, which no installed nsqd does (pip writes the .pyc files of an
install; an editable checkout writes them on its first start), so the warm figure would not be an operator's.
"""
import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import emit, environment, git_commit, log
from benchmarks.process import LISTENING, REPO


HELLO = re.compile(rb"INFO: nsqd v")
KERNELS = re.compile(rb"kernels ready in ([0-9.]+)s")
HTTP_LISTENING = re.compile(rb"HTTP: listening on ")
LANE_ON = re.compile(rb"worker \d+: forward lane on")
PROGRESS = re.compile(rb"INFO: compiled \d+/\d+: ")
PACKAGES = (("nsqpy", "nsqpy"), ("ipc", "nsqpy/ipc"), ("workers", "nsqpy/workers"), ("http_api", "nsqpy/http_api"))


def install(checkout, site):
    """A copy of the checkout's packages in ``site``, laid out as a wheel installs them (setup.cfg's package_dir:
    ipc/, workers/ and http_api/ inside nsqpy/). nsqd runs from there (its working directory: ``python -m`` puts
    it first on sys.path): a copy in the repository's layout would import this virtualenv's editable install's
    ipc/ and workers/ instead of its own, and a copy taken at the start keeps a run's sources fixed while others
    edit the checkout. The kernel cache's key names files as a checkout does, so the copy shares its cache."""
    for package, there in PACKAGES:
        shutil.copytree(os.path.join(checkout, package), os.path.join(site, there),
                        ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _nsqd(*flags):
    return [sys.executable, "-m", "nsqpy.workers.processes.nsqd", *flags]


def _env(cache_home):
    env = dict(os.environ, XDG_CACHE_HOME=cache_home, PYTHONUNBUFFERED="1")
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # see the module docstring
    return env


def start_time(checkout, cache_home, workers, http=True, argv=None):
    """-> (seconds from exec to TCP's listening line, {phase: seconds} of those nsqd logged, and http_s; and on a
    first start full_speed_s, exec to the last worker's `forward lane on`). ``argv``: another server (Go nsqd),
    started the same way with a fresh data path (``{data}`` in it)."""
    data = tempfile.mkdtemp(prefix="nsqpy-first-")
    http_flag = "--http-address=127.0.0.1:0" if http else "--http-address="
    if argv is None:
        argv = _nsqd("--tcp-address=127.0.0.1:0", http_flag, f"--data-path={data}", f"--workers={workers}",
                     "--log-level=debug")
    else:
        argv = [a.format(data=data) for a in argv] + ["--tcp-address=127.0.0.1:0", http_flag]
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=checkout, env=_env(cache_home), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    phases, tcp, lanes, cold = {}, None, 0, False
    try:
        for line in proc.stdout:
            if b"compiling the forward lane in the background" in line:
                cold = True  # a first start: its workers switch the lane on later (waited for: full_speed_s)
            if b"the forward lane failed" in line:
                cold = False  # (nsqd says so: the workers go on without it)
            if "hello_s" not in phases and HELLO.search(line):
                phases["hello_s"] = time.monotonic() - t0
            kernels = KERNELS.search(line)
            if kernels:
                phases["kernels_s"] = float(kernels.group(1))
            if tcp is None and LISTENING.search(line):
                tcp = time.monotonic() - t0
            if http and HTTP_LISTENING.search(line):
                phases["http_s"] = time.monotonic() - t0
            if LANE_ON.search(line):
                lanes += 1
                if lanes == workers:
                    phases["full_speed_s"] = time.monotonic() - t0
            if tcp is not None and (not http or "http_s" in phases) and (not cold or "full_speed_s" in phases):
                return tcp, phases
        raise SystemExit(f"{checkout}: {argv[0]} exited with {proc.wait()} before listening")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        shutil.rmtree(data, ignore_errors=True)


def compile_only_time(checkout, cache_home):
    """``nsqd --compile-only`` on ``cache_home``: -> (seconds from exec to its exit, {"progress": its `compiled
    k/N` lines, "first_line_s": exec to its first line})."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    proc = subprocess.Popen(_nsqd("--compile-only"), cwd=checkout, env=_env(cache_home), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    phases = {"progress": 0}
    for line in proc.stdout:
        phases.setdefault("first_line_s", time.monotonic() - t0)
        phases["progress"] += bool(PROGRESS.search(line))
    if proc.wait() != 0:
        raise SystemExit(f"{checkout}: nsqd --compile-only exited with {proc.returncode}")
    total = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # nsqd's compiling children too: it waited for them
    phases["cpu_s"] = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return total, phases


STEP_TIMER = """
import json, sys, time
from nsqpy.workers.lane import warmup
steps = warmup._steps(sys.argv[1])
if sys.argv[2] == "count":
    print(json.dumps({"steps": len(steps)}))
    sys.exit(0)
i = int(sys.argv[2])
step = steps[i]
if hasattr(warmup, "dependencies"):
    waits = list(warmup.dependencies(steps).get(i, ()))
else:  # a checkout of before 2026-11-27: a step of WAITS_FOR_PREVIOUS waits for every step before it
    waits = list(range(i)) if step in getattr(warmup, "WAITS_FOR_PREVIOUS", ()) else []
for j in waits:  # as in the warm-up: the steps it waits for compiled first (untimed), so their kernels are there
    steps[j]()
t0 = time.perf_counter()
step()
fn = getattr(step, "func", step)
print(json.dumps({"name": f"{fn.__module__}.{fn.__qualname__}", "s": time.perf_counter() - t0, "waits": waits,
                  "deferred": fn in getattr(warmup, "DEFERRED", ())}))
"""


def step_cost(checkout, index):
    """Warm-up step ``index`` compiled alone: -> {"name", "s": seconds} ({"steps": how many} for "count")."""
    cache = tempfile.mkdtemp(prefix="nsqpy-cache-")
    env = dict(os.environ, XDG_CACHE_HOME=cache)
    env.pop("NUMBA_CACHE_DIR", None)
    try:
        out = subprocess.run([sys.executable, "-c", STEP_TIMER, f"nsqpy-step{os.getpid()}-", str(index)],
                             cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if out.returncode != 0:
        raise SystemExit(f"warm-up step {index} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def predicted_kernels_s(seconds, processes, waits=None):
    """The warm-up's queue (each process, when free, takes the next step in order; step k starts once the steps
    at the indices ``waits[k]`` finished, all taken before it): -> when the last finishes."""
    free_at = [0.0] * max(1, min(len(seconds), processes))
    ends = []
    for k, s in enumerate(seconds):
        i = free_at.index(min(free_at))
        start = max([free_at[i]] + [ends[j] for j in (waits or {}).get(k, ())])
        free_at[i] = start + s
        ends.append(free_at[i])
    return max(free_at)


def predictions(steps):
    """{P: predicted_kernels_s} for these timed steps (a subset of --steps: waits for steps not timed count 0)."""
    at = {x["index"]: k for k, x in enumerate(steps)}
    waits = {k: [at[j] for j in x["waits"] if j in at] for k, x in enumerate(steps)}
    return {p: round(predicted_kernels_s([x["s"] for x in steps], p, waits), 2) for p in (1, 2, 4, 16, 64)}


def steps_main(opts):
    if opts.steps == "all":
        indices = range(step_cost(REPO, "count")["steps"])
    else:
        indices = [int(i) for i in opts.steps.split(",")]
    steps = []
    for i in indices:
        got = step_cost(REPO, i)
        steps.append({"index": i, "name": got["name"], "s": round(got["s"], 3), "waits": got.get("waits", []),
                      "deferred": got.get("deferred", False)})
        log(f"step {i} {got['name']}: {got['s']:.2f}s" + (" (after listening)" if got.get("deferred") else ""))
    waited = [x for x in steps if not x["deferred"]]  # nsqd listens once these are done
    result = dict(environment(), tool="first_start", mode="steps", steps=steps,
                  predicted_kernels_s=predictions(waited), predicted_all_steps_s=predictions(steps))
    emit(result, opts.out)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", nargs="?", const="all", default=None,
                   help="time each warm-up step's compile alone (or those at the indices given, e.g. 6,7)")
    p.add_argument("--rounds", type=int, default=1, help="rounds (each cold one costs ~30 s of CPU)")
    p.add_argument("--warm-starts", type=int, default=1,
                   help="warm starts per round and checkout, after its cold start (alternating between checkouts)")
    p.add_argument("--compile-only", action="store_true",
                   help="also time nsqd --compile-only on a fresh cache and the start after it (the install step)")
    p.add_argument("--go-nsqd", default="", help="path of a Go nsqd binary to start in the same rounds")
    p.add_argument("--moved", action="store_true",
                   help="also time a start of a copy of each checkout elsewhere, on its filled cache (moved_s)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-http", action="store_true", help="start nsqd with --http-address= (no HTTP API)")
    p.add_argument("--baseline-checkout", default="")
    p.add_argument("--out", default="")
    opts = p.parse_args(argv)
    if opts.steps is not None:
        return steps_main(opts)
    sources = {"current": REPO}
    if opts.baseline_checkout:
        sources["baseline"] = opts.baseline_checkout
    checkouts = {name: install(path, tempfile.mkdtemp(prefix=f"nsqpy-{name}-")) for name, path in sources.items()}
    try:
        _rounds(opts, checkouts)
    finally:
        for site in checkouts.values():
            shutil.rmtree(site, ignore_errors=True)


def _rounds(opts, checkouts):
    kinds = ("cold", "warm") + (("moved",) if opts.moved else ()) + (
        ("compile_only", "after_compile_only") if opts.compile_only else ())
    runs = {name: {f"{kind}_s": [] for kind in kinds} for name in checkouts}
    go_skipped = None
    if not opts.go_nsqd:
        go_skipped = "no --go-nsqd given"
    elif not (os.path.isfile(opts.go_nsqd) and os.access(opts.go_nsqd, os.X_OK)):
        go_skipped = f"{opts.go_nsqd} is not an executable file"
    if go_skipped:
        log(f"Go nsqd skipped: {go_skipped}")
    else:
        runs["go"] = {"start_s": []}
    http = not opts.no_http

    def record(name, kind, total, phases):
        runs[name][f"{kind}_s"].append(round(total, 2))
        for phase, seconds in phases.items():
            runs[name].setdefault(f"{kind}_{phase}", []).append(round(seconds, 3))

    load_before = os.getloadavg()  # a shared machine: what else ran is part of the figures
    for r in range(opts.rounds):
        caches = {name: tempfile.mkdtemp(prefix="nsqpy-cache-") for name in checkouts}
        installed = {name: tempfile.mkdtemp(prefix="nsqpy-cache-") for name in checkouts}
        try:
            for name, checkout in checkouts.items():
                record(name, "cold", *start_time(checkout, caches[name], opts.workers, http))
            for _ in range(opts.warm_starts):  # alternating between the checkouts
                for name, checkout in checkouts.items():
                    record(name, "warm", *start_time(checkout, caches[name], opts.workers, http))
            if "go" in runs:
                total, phases = start_time(REPO, caches["current"], opts.workers, http,
                                           argv=[opts.go_nsqd, "--data-path={data}"])
                runs["go"]["start_s"].append(round(total, 3))
                if "http_s" in phases:
                    runs["go"].setdefault("http_s", []).append(round(phases["http_s"], 3))
            if opts.compile_only:
                for name, checkout in checkouts.items():
                    record(name, "compile_only", *compile_only_time(checkout, installed[name]))
                    record(name, "after_compile_only", *start_time(checkout, installed[name], opts.workers, http))
            if opts.moved:
                for name, checkout in checkouts.items():
                    with tempfile.TemporaryDirectory(prefix="nsqpy-moved-") as moved:
                        site = shutil.copytree(checkout, os.path.join(moved, "site"),  # (the copy's copy)
                                               ignore=shutil.ignore_patterns("__pycache__"))
                        record(name, "moved", *start_time(site, caches[name], opts.workers, http))
        finally:
            for cache in (*caches.values(), *installed.values()):
                shutil.rmtree(cache, ignore_errors=True)
        for name in checkouts:
            got = runs[name]
            log(f"round {r} {name}: cold {got['cold_s'][-1]:.1f}s"
                + (f" (full speed {got['cold_full_speed_s'][-1]:.1f}s)" if got.get("cold_full_speed_s") else "")
                + ", warm " + ", ".join(f"{w:.2f}s" for w in got["warm_s"][-opts.warm_starts:])
                + (f", moved {got['moved_s'][-1]:.2f}s" if opts.moved else "")
                + (f", compile-only {got['compile_only_s'][-1]:.1f}s then {got['after_compile_only_s'][-1]:.2f}s"
                   if opts.compile_only else ""))
        if "go" in runs:
            log(f"round {r} go: {runs['go']['start_s'][-1]:.3f}s")
    medians = {name: {k: statistics.median(v) for k, v in figs.items() if v} for name, figs in runs.items()}
    result = dict(environment(), tool="first_start", workers=opts.workers, http=http, runs=runs, medians=medians,
                  rounds=opts.rounds, load_average=[round(x, 2) for x in (load_before[0], os.getloadavg()[0])])
    if go_skipped:
        result["go_skipped"] = go_skipped
    if "baseline" in medians:
        result["baseline_commit"] = git_commit(opts.baseline_checkout)
        for kind in kinds:
            result[f"{kind}_ratio_current_to_baseline"] = round(medians["current"][f"{kind}_s"]
                                                                / medians["baseline"][f"{kind}_s"], 3)
    emit(result, opts.out)


if __name__ == "__main__":
    main()
