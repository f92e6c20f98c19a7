"""The real ``nsqd`` with flags nsqpy does not implement (nsqpy/config/support.py): a security flag is refused
with one FATAL line and exit code 1 before anything is created; an accepted flag without effect costs one
WARNING line, and the broker serves as usual."""
import os
import subprocess
import sys

import pytest

from nsqpy.ipc.shm import instance_prefix
from wire import consumer, producer, unique

NODE_ID = 7


def shm_of(data_path):
    prefix = instance_prefix(str(data_path), NODE_ID).lstrip("/")
    return [e for e in os.listdir("/dev/shm") if e.startswith(prefix)]


@pytest.mark.parametrize("flags, refused", [
    (["--tls-cert=/nonexistent/cert.pem", "--tls-key=/nonexistent/key.pem"],
     "FATAL: failed to load TLS certificate/key: [Errno 2] No such file or directory"),
    (["--tcp-address=/run/nsqd.sock"],
     "FATAL: --tcp-address=/run/nsqd.sock is not supported yet: nsqpy has no unix socket listeners yet, so nsqd "
     "refuses to start"),
], ids=["tls", "unix"])
def test_a_security_flag_is_refused_before_anything_is_created(tmp_path, flags, refused):
    data = tmp_path / "data"
    data.mkdir()
    run = subprocess.run([sys.executable, "-m", "nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=",
                          f"--data-path={data}", "--workers=1", f"--node-id={NODE_ID}", *flags],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert run.returncode == 1, run
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("[nsqd] ") and lines[0].endswith(refused), run.stderr
    assert list(data.iterdir()) == [] and shm_of(data) == []


def test_an_unused_flag_is_one_warning_and_the_broker_serves(nsqd_factory):
    nsqd = nsqd_factory("--topology-zone=eu-1a")
    # flag warnings only: a host with a dead instance's shared memory left over gets a warning about that too
    warnings = [line for line in nsqd.lines if "WARNING: flag " in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        "WARNING: flag --topology-zone is accepted for compatibility but not used yet: topology-aware consumption "
        "is not implemented"), warnings
    topic = unique()
    with consumer(nsqd.address, topic, "ch", rdy=1) as c:
        producer(nsqd.address, topic, b"served")
        assert c.read_message().body == b"served"
