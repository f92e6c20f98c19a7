"""The broker's life cycle as an operator sees it: a stop requested while nsqd is still starting (systemd's
stop right after start, a test harness giving up) must end in a clean exit, with no child left running and no
shared memory left behind."""
import os
import signal
import subprocess
import sys
import time

from ipc.shm import instance_prefix


def test_sigterm_during_start_up_exits_cleanly(tmp_path):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "workers.nsqd", "--tcp-address=127.0.0.1:0",
                             "--http-address=127.0.0.1:0", f"--data-path={tmp_path}", "--node-id=9", "--workers=2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        line = proc.stdout.readline().decode()  # the version line: nsqd is now warming up, nothing forked yet
        assert "nsqd v1.3.0-nsqpy" in line, line
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    deadline = time.monotonic() + 10
    while True:  # the children are gone with it: nobody is left in its process group
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, "a child of nsqd outlived it"
        time.sleep(0.05)  # polling for processes to disappear; there is no event to wait on
    prefix = instance_prefix(str(tmp_path), 9).lstrip("/")
    assert not [e for e in os.listdir("/dev/shm") if e.startswith(prefix)]
