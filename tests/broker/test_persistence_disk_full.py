"""A full data path: publishes that need the disk fail with E_PUB_FAILED and /ping turns NOK (healthy again once
a store works); a stop that cannot save leaves the messages in shared memory (exit code 4) and the next start
with room on the disk recovers them all. Runs in a private mount namespace with a small tmpfs as data path."""
from tests.private_tmpfs import run_with_tmpfs

SCRIPT = r'''
import atexit, json, os, subprocess, sys, urllib.request, urllib.error
from tests.broker.conftest import Nsqd
from tests.broker.wire import Conn, consumer
from nsqpy.protocol import client as C

data = sys.argv[1]
args = ["--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", f"--data-path={data}", "--workers=2",
        "--node-id=3", "--mem-queue-size=16384"]   # 4 KB messages: memory's cap of 16 MiB comes before the count
out = {}

def ping(n):
    try:
        with urllib.request.urlopen(f"http://{n.http_address[0]}:{n.http_address[1]}/ping", timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()

brokers = []
atexit.register(lambda: [b.proc.poll() is None and os.killpg(b.proc.pid, 9) for b in brokers])  # a failure
n = Nsqd(args, data, 3)
brokers.append(n)
body = b"x" * 4000
acked = 0
failed = None
with Conn(n.address) as p:
    for k in range(400):                      # 400 x 50 x 4 KB = 80 MB: far past memory (16 MiB) and the 24 MiB disk
        p.send(C.mpub("big", [body] * 50))
        frame = p.expect_frame()
        if frame[0] != 0:
            failed = frame[1].decode()
            break
        acked += 50
out["acked"], out["failed"] = acked, failed
out["ping_full"] = ping(n)
c = consumer(n.address, "big", "ch", rdy=2500)
got = 0
while got < acked:
    m = c.read_message(timeout=60)
    c.send(C.fin(m.id))
    got += 1
c.sync()
with Conn(n.address) as p:                   # room again: a store works, healthy again
    p.send(C.pub("big", b"again"))
    p.expect_response(b"OK")
out["ping_after"] = ping(n)
c.close()
# fill memory again (shared memory holds 16 MiB, the disk has 24), then remove most of the disk's room: the stop
# cannot write its queues
with Conn(n.address) as p:
    for k in range(60):
        p.send(C.mpub("big", [b"k%d-%d" % (k, i) + body for i in range(50)]))
        p.expect_response(b"OK")
out["kept_acked"] = 60 * 50 + 1
with open(os.path.join(data, "filler"), "wb") as f:
    try:
        while True:
            f.write(b"\0" * (1 << 20))
            f.flush()
    except OSError:
        pass
out["stop_code"] = n.stop(timeout=120)
out["segments_after_stop"] = len(n.segments_left())
os.unlink(os.path.join(data, "filler"))
subprocess.run(["mount", "-o", "remount,size=256m", data], check=True)
n2 = Nsqd(args, data, 3)
brokers.append(n2)
out["recovered"] = any("recovered the crashed instance's messages" in line for line in n2.lines)
c = consumer(n2.address, "big", "ch", rdy=2500)
bodies = set()
try:
    while len(bodies) < out["kept_acked"]:
        m = c.read_message(timeout=60)
        bodies.add(m.body[:12])
        c.send(C.fin(m.id))
except AssertionError:
    sys.stderr.write(f"{len(bodies)} of {out['kept_acked']} came back\n" + n.output()[-8000:] + "\n---\n"
                     + n2.output()[-8000:])
    raise
c.close()
out["received"] = len(bodies)
out["stop2"] = n2.stop(timeout=120)
out["segments_left"] = len(n2.segments_left())
print(json.dumps(out))
'''


def test_a_full_data_path_fails_publishes_cleanly_and_a_stop_that_cannot_save_loses_nothing(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    proc, got = run_with_tmpfs(tmp_path, SCRIPT, {str(data): "24m"}, args=[str(data)])
    assert got is not None, proc.stderr[-6000:] + proc.stdout[-3000:]
    assert got["failed"] and got["failed"].startswith("E_MPUB_FAILED"), got
    assert got["acked"] > 0, got
    code, text = got["ping_full"]
    assert code == 500 and text.startswith("NOK - "), got
    assert got["ping_after"] == [200, "OK"], got
    assert got["stop_code"] == 4 and got["segments_after_stop"] > 0, got   # nothing saved, nothing thrown away
    assert got["recovered"] and got["received"] == got["kept_acked"], got
    assert got["stop2"] == 0 and got["segments_left"] == 0, got
