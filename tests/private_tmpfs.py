"""Run a Python script in a private mount namespace whose /dev/shm (and other paths) are small tmpfs mounts: a
real ENOSPC for code that must fail cleanly on a full filesystem, without touching the host's /dev/shm.

Needs root and unshare(1); where they are missing the calling test is skipped with the reason (CI runs as root)."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = str(pathlib.Path(__file__).resolve().parents[1])


def run_with_tmpfs(tmp_path, script_text, mounts, args=()):
    """Run script_text with each of mounts {path: size} mounted as a tmpfs first; -> (process, the JSON object
    on its last stdout line, or None when it failed)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs in a private mount namespace needs root")
    if shutil.which("unshare") is None:
        pytest.skip("unshare(1) is not installed")
    script = tmp_path / "inside.py"
    script.write_text(script_text)
    shell = " && ".join([f"mount -t tmpfs -o size={size} tmpfs {path}" for path, size in mounts.items()]
                        + [" ".join(["exec", sys.executable, str(script), *map(str, args)])])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", shell],
                          capture_output=True, text=True, timeout=300, env=env)
    if proc.returncode != 0 and "mount" in proc.stderr and "Traceback" not in proc.stderr:
        pytest.skip(f"cannot mount a tmpfs in a private namespace here: {proc.stderr.strip()}")
    got = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else None
    return proc, got
