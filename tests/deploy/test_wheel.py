"""A wheel built from this tree, installed into a new virtualenv, runs: its nsqd console script starts from the
example config, takes a publish and delivers it, and stops cleanly. The new virtualenv gets nsqpy only from the
wheel; its dependencies (numpy, numba, gunicorn, ...) come from this test run's virtualenv through a .pth line, so
that the test needs no package index."""
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile

from nsqpy.protocol import client as C
from tests.broker.conftest import HTTP_LISTEN_RE, LISTEN_RE, START_DEADLINE
from tests.broker.wire import Conn, consumer, unique

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _run(*argv, **kw):
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_a_wheel_in_a_new_virtualenv_serves_from_the_example_config(tmp_path):
    src = tmp_path / "src"  # a copy: building in place would leave build/ in the checkout
    files = _run("git", "ls-files", "-co", "--exclude-standard", cwd=ROOT).stdout.split("\n")
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(src))
    wheel, = (tmp_path / "dist").glob("nsqpy-*.whl")
    with zipfile.ZipFile(wheel) as z:  # one installed top-level name: workers/, ipc/, http_api/ live under nsqpy/
        assert {n.split("/")[0] for n in z.namelist() if not n.split("/")[0].endswith(".dist-info")} == {"nsqpy"}
        top_level = [n for n in z.namelist() if n.endswith(".dist-info/top_level.txt")]
        assert [z.read(n).decode().split() for n in top_level] in ([], [["nsqpy"]])
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    _run(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps",
         "--no-index", str(wheel))
    site = pathlib.Path(_run(str(venv / "bin" / "python"), "-c",
                             "import sysconfig; print(sysconfig.get_path('purelib'))").stdout.strip())
    (site / "zz_test_deps.pth").write_text(sysconfig.get_path("purelib") + "\n")  # after the wheel's own files
    data = tmp_path / "data"
    data.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.Popen([str(venv / "bin" / "nsqd"), f"--config={ROOT / 'deploy' / 'config' / 'nsqd.toml'}",
                             f"--data-path={data}", "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            cwd=tmp_path, start_new_session=True)
    try:
        lines, tcp = [], None
        for line in proc.stdout:  # (readline blocks at most until nsqd's next line or its end)
            lines.append(line)
            tcp = tcp or LISTEN_RE.search(line.strip())
            if HTTP_LISTEN_RE.search(line.strip()):
                break
        assert tcp, "".join(lines)
        address = (tcp.group(1), int(tcp.group(2)))
        topic = unique()
        with Conn(address) as p:
            p.send(C.pub(topic, b"from the wheel"))
            p.expect_response(b"OK")
        with consumer(address, topic, "ch", rdy=1) as c:
            m = c.read_message(START_DEADLINE)
            assert m.body == b"from the wheel"
            c.send(C.fin(m.id))
            c.sync()
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, "".join(lines) + rest
    out = "".join(lines)
    where = _run(str(venv / "bin" / "python"), "-c", "import nsqpy.workers as w, nsqpy.ipc, nsqpy.http_api; "
                 "print(w.__file__)",
                 cwd=tmp_path, env=env).stdout
    assert where.startswith(str(venv)), where  # nsqd ran the wheel's code, not this checkout's
    assert "FATAL" not in out and "ERROR" not in out, out
