"""deploy/systemd/*.service pass ``systemd-analyze verify`` without a single warning (each checked as a copy whose
ExecStart is this virtualenv's console script: verify wants the binary to exist), and keep the settings a clean stop
and the exit-code contract rely on."""
import configparser
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from nsqpy.workers.processes.supervisor import EXIT_CANNOT_RUN

UNITS = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "systemd"
INSTALLED_BIN = "/opt/nsqpy/venv/bin/"
NAMES = ["nsqd", "nsqlookupd", "nsqadmin"]


def _settings(path):
    parser = configparser.ConfigParser(strict=False, interpolation=None, delimiters=("=",))
    parser.optionxform = str
    parser.read(path)
    return parser["Service"]


@pytest.mark.parametrize("name", NAMES)
def test_systemd_analyze_verify_says_nothing(name, tmp_path):
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (Debian: apt-get install systemd)"
    text = (UNITS / f"{name}.service").read_text()
    assert INSTALLED_BIN + name in text
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(pathlib.Path(sys.executable).parent / name, bin_dir / name)
    copy = tmp_path / f"{name}.service"
    copy.write_text(text.replace(INSTALLED_BIN, f"{bin_dir}/"))
    done = subprocess.run([analyze, "verify", "--man=no", str(copy)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not (done.stdout + done.stderr).strip(), done.stdout + done.stderr


@pytest.mark.parametrize("name", NAMES)
def test_units_notify_stop_cleanly_and_do_not_restart_what_cannot_run(name):
    unit = _settings(UNITS / f"{name}.service")
    assert unit["Type"] == "notify"
    assert unit["KillMode"] == "mixed"  # SIGTERM to the supervisor alone: it stops its children in order
    assert str(EXIT_CANNOT_RUN) in unit["RestartPreventExitStatus"].split()
    assert unit["NoNewPrivileges"] == "yes" and unit["ProtectSystem"] == "strict"


def test_nsqd_unit_keeps_shared_memory_and_has_time_to_save():
    from nsqpy.workers.processes.nsqd import SHUTDOWN_TIMEOUT
    unit = _settings(UNITS / "nsqd.service")
    assert unit["RemoveIPC"] == "no" and "/dev/shm" in unit["ReadWritePaths"].split()
    assert "PrivateDevices" not in unit  # /dev/shm must be the host's: the next start recovers a crash from it
    assert int(unit["TimeoutStopSec"]) > SHUTDOWN_TIMEOUT
    assert unit["StateDirectory"] == "nsqd" and "--data-path=/var/lib/nsqd" in unit["ExecStart"]
