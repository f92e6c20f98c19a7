"""A daemon that cannot start says why in one line and exits 1, before nsqd's warm-up (which can compile for tens
of seconds): a data path that does not exist, is a file or cannot be written, and a listen address in use (named),
for nsqd and nsqlookupd. Real processes; the address is held by a real listening socket of the test."""
import os
import shutil
import socket
import subprocess
import sys

import pytest


@pytest.fixture
def taken():
    """A port another process listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def _read_only(path):
    """The command prefix that runs a command with ``path`` read-only (a bind mount in a private mount namespace:
    root ignores permission bits, not a read-only mount)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a read-only bind mount in a private mount namespace needs root and unshare(1)")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
            f'mount --bind "{path}" "{path}" && mount -o remount,ro,bind "{path}" && exec "$0" "$@"']


NSQD = [sys.executable, "-m", "nsqpy.workers.processes.nsqd", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]
LOOKUPD = [sys.executable, "-m", "nsqpy.http_api.lookupd.main", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"]

# (case, command builder(tmp_path, taken address) -> argv, words the one line must hold)
CASES = [
    ("nsqd data path missing", lambda tmp, addr: NSQD + [f"--data-path={tmp}/nope"],
     ["FATAL", f"/nope does not exist", "mkdir -p"]),
    ("nsqd data path is a file", lambda tmp, addr: NSQD + [f"--data-path={_file(tmp)}"],
     ["FATAL", "is not a directory"]),
    ("nsqd data path read-only", lambda tmp, addr: _read_only(tmp) + NSQD + [f"--data-path={tmp}"],
     ["FATAL", "is not writable (Read-only file system)"]),
    ("nsqd TCP address in use", lambda tmp, addr: NSQD + [f"--data-path={tmp}", f"--tcp-address={addr}"],
     ["FATAL", "listen ({addr}) failed - address already in use", "--tcp-address"]),
    ("nsqd HTTP address in use", lambda tmp, addr: NSQD + [f"--data-path={tmp}", f"--http-address={addr}"],
     ["FATAL", "listen ({addr}) failed - address already in use", "--http-address"]),
    ("nsqlookupd TCP address in use", lambda tmp, addr: LOOKUPD + [f"--tcp-address={addr}"],
     ["FATAL", "listen ({addr}) failed - address already in use", "--tcp-address"]),
    ("nsqlookupd HTTP address in use", lambda tmp, addr: LOOKUPD + [f"--http-address={addr}"],
     ["FATAL", "listen ({addr}) failed - address already in use", "--http-address"]),
]


def _file(tmp):
    path = tmp / "a-file"
    path.write_text("")
    return path


@pytest.mark.parametrize("case, command, words", CASES, ids=[c[0] for c in CASES])
def test_start_error_is_one_line_and_exit_1(tmp_path, taken, case, command, words):
    done = subprocess.run(command(tmp_path, taken), capture_output=True, text=True, timeout=120)
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, (done.returncode, lines)
    for word in words:
        assert word.format(addr=taken) in lines[0], lines[0]
    assert not [e for e in os.listdir(tmp_path) if e.startswith(".nsqpy-probe")]
