"""What persistence costs at a stop and a start: a clean shutdown with N queued messages, the start that loads
them, and the recovery after a whole-broker SIGKILL, with N messages of --size bytes on one channel.

    python -m benchmarks.persistence_bench [--messages=1000000] [--size=200] [--workers=2] [--out=FILE]

Each phase starts nsqd (port 0, a fresh data path; `TCP: listening on` is the ready line), publishes N messages
(MPUB of 200 on --connections pipelined connections) to a topic whose channel exists, then:

* clean: SIGTERM, time until nsqd exited (``shutdown_s``: every message saved to disk), the bytes on disk, then
  a new nsqd on the same data path: time from exec to its listening line (``start_with_queue_s``, the queues
  loaded), and a consumer receives all N (counted, checked);
* crash: SIGKILL of every process at once, then a new nsqd: time from exec to listening (``recovery_s``: the dead
  instance's shared memory saved to disk and loaded), and a consumer receives all N;
* empty: the start of an nsqd with nothing to load, for reference (``start_empty_s``);
* write: bench_writer's MPUB 200 x 200 B throughput with the default configuration, with --mem-queue-size=0
  (durable: on disk, fsync every --sync-every=2500 messages) and with --sync-every=1 added, next to a checkout of
  a commit without persistence (``--baseline-checkout``), interleaved over --rounds.

Prints one JSON line (with the git commit, core count and command).
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks.common import emit, environment, log
from benchmarks.process import LISTENING, REPO, run_tool
from nsqpy.protocol import client as C
from benchmarks.wire import Connection, MessageStream, fin_lines, mpub_pipelined, warm_up

TOPIC, CHANNEL = "persist_bench", "ch"


class Broker:
    def __init__(self, data, workers, flags=(), cwd=REPO):
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0",
                                      "--http-address=", f"--data-path={data}", f"--workers={workers}", *flags],
                                     cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.lines = []
        for raw in self.proc.stdout:
            self.lines.append(raw)
            m = LISTENING.search(raw)
            if m:
                self.address = (m.group(1).decode(), int(m.group(2)))
                break
        else:
            raise SystemExit(b"".join(self.lines).decode(errors="replace"))
        self.ready_s = time.monotonic() - self.t0
        threading.Thread(target=lambda: self.lines.extend(self.proc.stdout), daemon=True).start()

    @property
    def address_text(self):
        return "%s:%d" % self.address

    def stop(self):
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(600)
        return code, time.monotonic() - t0

    def kill_all(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def publish(address, n, size, connections):
    body = b"p" * size
    per = n // connections

    def one(count):
        conn = Connection(address)
        mpub_pipelined(conn, TOPIC, count, body)  # at most 32 MPUBs waiting for their OK
        conn.sock.close()

    threads = [threading.Thread(target=one, args=(per + (n % connections if i == 0 else 0),))
               for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def make_channel(address):
    conn = Connection(address)
    conn.send(C.sub(TOPIC, CHANNEL))
    conn.expect_ok("SUB")
    conn.sock.close()


def consume_all(address, n):
    """Receive n messages on the channel (FIN each); -> seconds."""
    conn = Connection(address, timeout=60)
    conn.subscribe(TOPIC, CHANNEL, 2500)
    stream = MessageStream(conn)
    t0 = time.monotonic()
    got = 0
    while got < n:
        batches = stream.read(60.0)
        if not batches and time.monotonic() - t0 > 600:
            raise SystemExit(f"only {got} of {n} messages came back")
        for batch in batches:
            got += len(batch)
            conn.send(fin_lines(stream.array, batch.body_offsets))
    conn.close()
    return time.monotonic() - t0


WRITE_CONFIGS = {
    "default": (),                                        # memory tier, saved at a stop
    "mem_queue_size_0": ("--mem-queue-size=0",),          # durable: every message and control block on disk
    "mem_queue_size_0_sync_every_1": ("--mem-queue-size=0", "--sync-every=1"),
}


def write_phase(base, opts):
    """bench_writer (MPUB 200 x 200 B) against each configuration, and against --baseline-checkout (a commit
    without persistence) if given, interleaved over --rounds; -> {config: [ops/s per round]}."""
    configs = dict(WRITE_CONFIGS)
    if opts.baseline_checkout:
        configs["no_persistence_baseline"] = ()
    rates = {name: [] for name in configs}
    for r in range(opts.rounds):
        for name, flags in configs.items():
            data = os.path.join(base, f"w-{name}-{r}")
            os.mkdir(data)
            cwd = opts.baseline_checkout if name == "no_persistence_baseline" else REPO
            b = Broker(data, opts.workers, flags, cwd=cwd)
            try:
                _, res = run_tool("benchmarks.bench_writer", "--nsqd-tcp-address", b.address_text, "--no-ceiling",
                                  "--connections", str(opts.connections), "--runfor", f"{opts.write_runfor}s",
                                  "--topic", "w", "--batch-size", "200", "--size", str(opts.size))
            finally:
                b.stop()
            rates[name].append(round(res["ops_per_s"]))
            log(f"write {name} round {r}: {res['ops_per_s']:.0f} msgs/s")
    return rates


def disk_bytes(path):
    return sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if ".diskqueue." in f)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--connections", type=int, default=2)
    p.add_argument("--write-runfor", type=float, default=5.0, help="seconds of bench_writer per configuration")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--baseline-checkout", default="",
                   help="a checkout of a commit before persistence, run as the no-persistence baseline")
    p.add_argument("--skip-write", action="store_true")
    p.add_argument("--out", default="")
    opts = p.parse_args(argv)
    warm_up()
    n = opts.messages
    result = dict(environment(), tool="persistence_bench", messages=n, size=opts.size, workers=opts.workers)
    base = tempfile.mkdtemp(prefix="nsqpy-persist-")
    try:
        if not opts.skip_write:
            rates = write_phase(base, opts)
            result["write_msgs_per_s"] = rates
            result["write_median_msgs_per_s"] = {k: statistics.median(v) for k, v in rates.items()}
        data = os.path.join(base, "clean")
        os.mkdir(data)
        b = Broker(data, opts.workers)
        result["start_empty_s"] = round(b.ready_s, 3)
        make_channel(b.address)
        t0 = time.monotonic()
        publish(b.address, n, opts.size, opts.connections)
        result["publish_msgs_per_s"] = round(n / (time.monotonic() - t0))
        code, result["shutdown_s"] = b.stop()
        assert code == 0, b"".join(b.lines).decode(errors="replace")[-3000:]
        result["disk_bytes"] = disk_bytes(data)
        log(f"clean stop: {result['shutdown_s']:.2f}s, {result['disk_bytes'] >> 20} MiB on disk")
        b = Broker(data, opts.workers)
        result["start_with_queue_s"] = b.ready_s
        result["consume_after_start_s"] = round(consume_all(b.address, n), 3)
        b.stop()

        data = os.path.join(base, "crash")
        os.mkdir(data)
        b = Broker(data, opts.workers)
        make_channel(b.address)
        publish(b.address, n, opts.size, opts.connections)
        b.kill_all()
        b = Broker(data, opts.workers)
        result["recovery_s"] = b.ready_s
        result["consume_after_recovery_s"] = round(consume_all(b.address, n), 3)
        b.stop()
        log(f"recovery after SIGKILL: {result['recovery_s']:.2f}s")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for k in ("start_with_queue_s", "recovery_s", "shutdown_s"):
        result[k] = round(result[k], 3)
    emit(result, opts.out)


if __name__ == "__main__":
    main()
