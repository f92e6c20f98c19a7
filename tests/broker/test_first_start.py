"""A first start (empty numba cache) compiles every kernel of the hot paths before nsqd says it listens.

A kernel signature the warm-up (``workers/lane/warmup.py``) misses compiles inside a worker the first time a client
takes that path: a stall of a few hundred milliseconds for every connection of that worker (the first second of
a latency run once measured 1 s at p99). numba writes each compiled signature to its cache directory at once, so
a file appearing there while clients publish, consume, FIN, REQ, TOUCH and read /stats is a signature the
warm-up lacks. Each reply below is the sync point: the kernel that served it was compiled (and saved) before it.
The forward lane is the exception: a first start compiles it in a background process after listening
(workers/lane/warmup.py DEFERRED), and the workers then load it.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from nsqpy.protocol import client as C
from wire import Conn, consumer, unique, warm_up

ROOT = Path(__file__).resolve().parents[2]


def _compiled(cache_home):
    return {str(p.relative_to(cache_home)) for p in Path(cache_home).rglob("*.nbc")}


def _fin_batch(address):
    """Two FINs in one read: the batched FIN kernel. Single PUBs from two connections: the pump, the forward
    to the topic's owner from whichever worker does not own it, and the owner's append of forwarded runs."""
    topic = unique()
    c = consumer(address, topic, "ch", rdy=4)
    with c, Conn(address) as p1, Conn(address) as p2:
        for p in (p1, p2, p1, p2):
            p.send(C.pub(topic, b"m"))
            p.expect_response(b"OK")
        msgs = c.read_messages(4)
        c.send(b"".join(C.fin(m.id) for m in msgs))
        with Conn(address) as sync:  # FINs carry no reply: a later command's reply on the consumer is the sync
            sync.send(C.pub(topic, b"last"))
            sync.expect_response(b"OK")
        assert [m.body for m in c.read_messages(1)] == [b"last"]


def _traffic(nsqd):
    warm_up(nsqd.address, topics=4)  # PUB, MPUB, DPUB, SUB, RDY, FIN, REQ, TOUCH on every worker
    _fin_batch(nsqd.address)
    host, port = nsqd.http_address
    with urllib.request.urlopen(f"http://{host}:{port}/stats?format=json", timeout=60) as r:
        assert json.load(r)["topics"]


def test_no_kernel_compiles_after_listening(nsqd_factory, tmp_path, monkeypatch):
    """A first start listens before the forward lane is compiled: the workers serve on the loop's Python path
    meanwhile, which compiles nothing (the background compile is stopped to hold that state), and once the lane's
    kernels are in the cache they load them and switch it on, compiling nothing either."""
    cache_home = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    nsqd = nsqd_factory("--log-level=debug")  # each worker says when it switches the lane on
    out = nsqd.output()
    assert "compiling the broker's kernels" in out and "`nsqd --compile-only`" in out  # a first start says so
    from nsqpy.workers.lane import warmup
    waited = [f for f in warmup.declared() if f not in warmup.DEFERRED]  # the steps nsqd listens after
    progress = re.findall(r"INFO: compiled (\d+)/(\d+): (\S+) ", out[:out.index("TCP: listening on")])
    assert [(int(k), int(n)) for k, n, _ in progress] == [(k, len(waited)) for k in range(1, len(waited) + 1)]
    assert sorted(name for _, _, name in progress) == sorted(warmup.step_name(f) for f in waited)
    compiler = int(nsqd.wait_for_line(r"compiling the forward lane in the background \(pid (\d+)\)").group(1))
    os.kill(compiler, signal.SIGSTOP)
    try:
        assert "compiled the forward lane" not in nsqd.output() and "forward lane on" not in nsqd.output()
        before = _compiled(cache_home)
        assert before  # the warm-up filled the cache
        _traffic(nsqd)
        assert sorted(_compiled(cache_home) - before) == []
    finally:
        os.kill(compiler, signal.SIGCONT)
    nsqd.wait_for_line("compiled the forward lane's kernels in the background", timeout=600)
    for w in range(2):
        nsqd.wait_for_line(f"worker {w}: forward lane on", timeout=60)
    # the same child compiles the rare paths' kernels next (a crashed worker's replacement may take one of those
    # paths): once they are in the cache too, nothing may compile any more
    nsqd.wait_for_line("compiled the rare paths' kernels in the background", timeout=600)
    lane = _compiled(cache_home)
    assert lane - before  # the background compile added the lane's kernels
    _traffic(nsqd)
    # a worker's replacement (forked from the supervisor, which never loaded the lane) loads it at its start
    seen = len(nsqd.output().splitlines())
    os.kill(int(nsqd.wait_for_line(r"worker 0: started \(pid (\d+)\)").group(1)), signal.SIGKILL)
    nsqd.wait_for_line("worker 0: forward lane on", timeout=120, start=seen)
    _traffic(nsqd)
    assert sorted(_compiled(cache_home) - lane) == []


def test_a_broker_stopped_right_after_its_first_start_leaves_the_lane_compiled(nsqd_factory, tmp_path,
                                                                               monkeypatch):
    """Stopping waits for the background compile, so the next start is warm and its workers start with the lane
    (a broker stopped seconds after each start, as a test's is, would otherwise never get it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    old = tmp_path / "cache" / "nsqpy" / "0.0.1-py3.11-numba0.60.0-0123456789ab"  # an earlier version's kernels
    old.mkdir(parents=True)
    os.utime(old, (time.time() - 40 * 86400,) * 2)
    first = nsqd_factory()
    first.wait_for_line("compiling the forward lane in the background")
    assert "removed 1 numba cache directories no start used for 30 days" in first.output() and not old.exists()
    assert first.stop() == 0
    assert "compiled the forward lane's kernels in the background" in first.output()
    mark = next((tmp_path / "cache" / "nsqpy").glob("*/.nsqpy-warmed"))
    os.utime(mark, (time.time() - 40 * 86400,) * 2)
    second = nsqd_factory("--log-level=debug")
    assert "compiling" not in second.output() and "forward lane on" not in second.output()  # on from the start
    assert time.time() - mark.stat().st_mtime < 86400  # a warm start touches the mark: its cache is in use
    with Conn(second.address) as p:  # served (the lane's own path: the owner's own PUB)
        p.send(C.pub(unique(), b"m"))
        p.expect_response(b"OK")


def _timers_and_http(nsqd):
    """HTTP publishes (the HTTP processes' control plane), a DPUB and a REQ with delays (the scanner's deferred
    heap), and a message left to time out (its in-flight heap) and redelivered, on a consumer of its own."""
    topic = unique()
    host, port = nsqd.http_address
    for path, body in (("pub", b"h1"), ("mpub", b"h2\nh3")):
        req = urllib.request.Request(f"http://{host}:{port}/{path}?topic={topic}", data=body)
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200
    with Conn(nsqd.address) as p:
        p.send(C.dpub(topic, 100, b"later"))
        p.expect_response(b"OK")
    with consumer(nsqd.address, topic, "ch", rdy=10) as c:
        msgs = c.read_messages(4, timeout=60)
        c.send(C.req(msgs[0].id, 100), *(C.fin(m.id) for m in msgs[1:]))
        [again] = c.read_messages(1, timeout=60)
        assert again.body == msgs[0].body
        c.send(C.fin(again.id))
        c.sync()
    topic = unique()
    with Conn(nsqd.address) as p:
        p.send(C.pub(topic, b"slow"))
        p.expect_response(b"OK")
    with consumer(nsqd.address, topic, "ch", rdy=1, msg_timeout=1000) as c:
        first = c.read_message(timeout=60)  # not FINed: it times out and comes again
        again = c.read_message(timeout=60)
        assert (again.id, again.attempts) == (first.id, 2)
        c.send(C.fin(again.id))
        c.sync()


def test_a_warm_start_loads_every_kernel_in_the_supervisor_before_it_forks(nsqd_factory, tmp_path, monkeypatch):
    """A kernel that a worker, the scanner or an HTTP process loads itself is loaded once per process instead of
    once, at a moment that process may be serving (a few milliseconds each, and 0.1-0.2 s for a process's first
    load if numba fills its registries then). Traffic on every worker, timers, HTTP publishes, a worker's
    replacement, a topic emptied and a restart that loads saved channel queues load nothing."""
    loads = tmp_path / "loads"
    monkeypatch.setenv("NSQPY_KERNEL_LOADS", str(loads))
    assert nsqd_factory(module="tests.broker.kernel_loads").stop() == 0  # fills this checkout's cache if cold
    loads.unlink(missing_ok=True)
    nsqd = nsqd_factory(module="tests.broker.kernel_loads")
    assert "compiling" not in nsqd.output()
    _traffic(nsqd)
    _timers_and_http(nsqd)
    seen = len(nsqd.output().splitlines())
    os.kill(int(nsqd.wait_for_line(r"worker 0: started \(pid (\d+)\)").group(1)), signal.SIGKILL)
    nsqd.wait_for_line(r"worker 0: started \(pid (\d+)\)", timeout=120, start=seen)
    _traffic(nsqd)
    saved = _emptied_and_saved(nsqd)
    assert nsqd.stop() == 0
    again = nsqd_factory(module="tests.broker.kernel_loads", data=Path(nsqd.data_path))
    with consumer(again.address, saved, "ch", rdy=10) as c:  # each worker loaded its saved queues at its start
        msgs = c.read_messages(3, timeout=60)
        assert sorted(m.body for m in msgs) == [b"s0", b"s1", b"s2"]
        c.send(*(C.fin(m.id) for m in msgs))
        c.sync()
    assert again.stop() == 0
    lines = loads.read_text().splitlines() if loads.exists() else []
    assert "\n".join(line for line in lines if int(line.split()[0]) not in (nsqd.proc.pid, again.proc.pid)) == ""


def _emptied_and_saved(nsqd):
    """A topic emptied over HTTP while it has no channel (its backlog dropped), and a channel left with messages
    that its next start loads from the saved queue. -> the saved channel's topic."""
    host, port = nsqd.http_address
    emptied, saved = unique(), unique()
    with Conn(nsqd.address) as p:
        p.send(C.mpub(emptied, [b"e0", b"e1"]))
        p.expect_response(b"OK")
    req = urllib.request.Request(f"http://{host}:{port}/topic/empty?topic={emptied}", data=b"")
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
    with consumer(nsqd.address, saved, "ch", rdy=0) as c:
        c.sync()  # the channel exists
    with Conn(nsqd.address) as p:
        p.send(C.mpub(saved, [b"s0", b"s1", b"s2"]))
        p.expect_response(b"OK")
    return saved


def test_the_same_sources_installed_elsewhere_start_warm(nsqd_factory, tmp_path, monkeypatch):
    """A reinstall into another directory (a new virtualenv, a release directory per deploy) finds the kernels the
    first install compiled: the cache directory and its entries do not depend on where the code lives
    (ipc/numba_cache.py, SourceTreeLocator), so only the first start after an upgrade compiles."""
    from nsqpy.ipc import numba_cache
    assert nsqd_factory().stop() == 0  # fills this checkout's cache if cold (and waits for the background compile)
    before = _compiled(Path(numba_cache.CACHE_DIR).parent)  # every cache directory of ours
    site = tmp_path / "release-2"
    # laid out as a wheel installs it (setup.cfg's package_dir): ipc/, workers/ and http_api/ inside nsqpy/
    for package, there in (("nsqpy", "nsqpy"), ("ipc", "nsqpy/ipc"), ("workers", "nsqpy/workers"),
                           ("http_api", "nsqpy/http_api")):
        shutil.copytree(ROOT / package, site / there, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(site)  # python -m nsqpy.workers.processes.nsqd runs the copy in the working directory
    moved = nsqd_factory("--log-level=debug")
    assert "compiling" not in moved.output() and "forward lane on" not in moved.output()  # on from the start
    assert os.readlink(f"/proc/{moved.proc.pid}/cwd") == str(site)  # so the copy's modules (sys.path[0])
    with Conn(moved.address) as p:
        p.send(C.pub(unique(), b"m"))
        p.expect_response(b"OK")
    assert moved.stop() == 0
    assert sorted(_compiled(Path(numba_cache.CACHE_DIR).parent) - before) == []  # loaded, none compiled again


def test_compile_only_fills_the_cache_so_that_the_next_start_loads_every_kernel(nsqd_factory, tmp_path,
                                                                                 monkeypatch):
    """nsqd --compile-only after an install or upgrade, before the service restarts: the restart compiles nothing,
    the forward lane and the rare paths' kernels included, and it leaves no shared memory behind."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    segments = set(os.listdir("/dev/shm"))

    def compile_only():
        out = subprocess.run([sys.executable, "-m", "nsqpy.workers.processes.nsqd", "--compile-only"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=900)
        assert out.returncode == 0, out.stdout
        return out.stdout

    first = compile_only()
    assert "compiling the broker's kernels" in first
    # progress: one line per warm-up step as it finishes (in either compiling process), counted 1..N
    from nsqpy.workers.lane import warmup
    total = len(warmup.declared())
    assert f"({total} steps in " in first
    progress = re.findall(r"INFO: compiled (\d+)/(\d+): (\S+) \([0-9.]+s\), [0-9.]+s so far", first)
    assert [(int(k), int(n)) for k, n, _ in progress] == [(k, total) for k in range(1, total + 1)]
    assert sorted(name for _, _, name in progress) == sorted(warmup.step_name(f) for f in warmup.declared())
    compiled = _compiled(tmp_path / "cache")
    again = compile_only()
    assert "compiling" not in again and "compiled " not in again  # already there: nothing to say but that
    assert "(every one was in the cache already)" in again
    assert [s for s in set(os.listdir("/dev/shm")) - segments if "compile" in s] == []
    nsqd = nsqd_factory("--log-level=debug")
    assert "compiling" not in nsqd.output() and "forward lane on" not in nsqd.output()  # on from the start
    _traffic(nsqd)
    saved = _emptied_and_saved(nsqd)  # a rare path: a topic emptied without channels
    assert nsqd.stop() == 0
    again = nsqd_factory(data=Path(nsqd.data_path))  # another: saved channel queues loaded at a worker's start
    with consumer(again.address, saved, "ch", rdy=10) as c:
        assert len(c.read_messages(3, timeout=60)) == 3
    assert again.stop() == 0
    assert sorted(_compiled(tmp_path / "cache") - compiled) == []
