"""The policy flags (issue 49): off by default, parsed as the other flags, bad values one line and exit 1 at the
start of the real nsqd command, and listed in --help and the example config."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from nsqpy.config import NsqdOptions
from nsqpy.config.example import example_config
from nsqpy.config.options import OptionsError

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLAGS = ("max-attempts", "dead-letter-topic-suffix", "message-ttl", "max-channel-depth", "max-channel-bytes",
         "channel-overflow")
MS = 1_000_000


def test_all_off_by_default():
    o = NsqdOptions.parse([])
    assert (o.max_attempts, o.dead_letter_topic_suffix, o.message_ttl, o.max_channel_depth, o.max_channel_bytes,
            o.channel_overflow) == (0, ".dead", 0, 0, 0, "block")


@pytest.mark.parametrize("argv, attr, value", [
    (["--max-attempts=5"], "max_attempts", 5),
    (["--max-attempts=65535"], "max_attempts", 65535),
    (["--dead-letter-topic-suffix=_dlq"], "dead_letter_topic_suffix", "_dlq"),
    (["--message-ttl=90s"], "message_ttl", 90_000 * MS),
    (["--message-ttl=1ms"], "message_ttl", MS),
    (["--max-channel-depth=0x100"], "max_channel_depth", 256),   # Go's ParseInt, as every Int flag
    (["--max-channel-bytes=1048576"], "max_channel_bytes", 1 << 20),
    (["--channel-overflow=reject"], "channel_overflow", "reject"),
    (["--channel-overflow=DROP_OLDEST"], "channel_overflow", "drop_oldest"),  # a Choice is case-insensitive
])
def test_good_values(argv, attr, value):
    assert getattr(NsqdOptions.parse(argv), attr) == value


BAD = [
    (["--max-attempts=-1"], "-max-attempts"),
    (["--max-attempts=65536"], "-max-attempts"),
    (["--max-attempts=many"], "-max-attempts"),
    (["--max-channel-depth=-5"], "-max-channel-depth"),
    (["--max-channel-bytes=1k"], "-max-channel-bytes"),
    (["--channel-overflow=spill"], "-channel-overflow"),
    (["--message-ttl=10"], "-message-ttl"),        # a duration needs its unit
    (["--message-ttl=-1s"], "--message-ttl"),
    (["--message-ttl=500us"], "--message-ttl"),    # would be 0 whole ms: off, silently
    (["--dead-letter-topic-suffix="], "--dead-letter-topic-suffix"),
    (["--dead-letter-topic-suffix=.d e"], "--dead-letter-topic-suffix"),
    (["--dead-letter-topic-suffix=#ephemeral"], "--dead-letter-topic-suffix"),
]


@pytest.mark.parametrize("argv, names", BAD)
def test_bad_values_are_refused(argv, names):
    with pytest.raises(OptionsError) as e:
        NsqdOptions.parse(argv)
    assert names in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("argv, names", [BAD[1], BAD[5], BAD[8]])
def test_nsqd_refuses_them_at_start_in_one_line(argv, names, tmp_path):
    """As any other bad flag value (an NSQ flag's, --max-deflate-level=10, for the exit code): one line, nothing
    started."""
    def run(*flags):
        return subprocess.run([sys.executable, "-m", "nsqpy.workers.processes.nsqd", f"--data-path={tmp_path}",
                               "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0", *flags],
                              capture_output=True, text=True, timeout=120)
    r = run(*argv)
    assert r.returncode != 0 and r.returncode == run("--max-deflate-level=10").returncode
    lines = [ln for ln in (r.stderr + r.stdout).splitlines() if ln.strip()]
    assert len(lines) == 1 and names in lines[0], lines
    assert list(tmp_path.iterdir()) == []


def test_help_lists_them_with_what_they_do():
    r = subprocess.run([sys.executable, "-m", "nsqpy.workers.processes.nsqd", "--help"], capture_output=True,
                       text=True, timeout=120)
    text = r.stdout + r.stderr
    for flag in FLAGS:
        assert f"-{flag}" in text, flag
    assert "dead_lettered_count" in text and "expired_count" in text and "dropped_count" in text
    assert "block, reject or drop_oldest" in text or "block (TCP back-pressure" in text


def test_example_config_lists_them():
    text = example_config(NsqdOptions)
    for flag in FLAGS:
        assert f"\n{flag.replace('-', '_')} = " in text, flag
    assert (ROOT / "deploy/config/nsqd.toml").read_text() == text


def test_config_file_sets_them(tmp_path):
    cfg = tmp_path / "nsqd.toml"
    cfg.write_text('max_attempts = 3\nmessage_ttl = "2s"\nchannel_overflow = "reject"\nmax_channel_depth = 7\n')
    o = NsqdOptions.parse([f"--config={cfg}"])
    assert (o.max_attempts, o.message_ttl, o.channel_overflow, o.max_channel_depth) == (3, 2000 * MS, "reject", 7)
    o = NsqdOptions.parse([f"--config={cfg}", "--max-attempts=4"])   # flags over the file
    assert o.max_attempts == 4
