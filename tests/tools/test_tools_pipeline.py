"""The utilities end to end as subprocesses against a real nsqd: to_nsq from a file -> nsq_to_file gives the
same lines back; nsq_tail -n prints and exits; SIGTERM stops the long-running ones cleanly."""

import os
import signal
import subprocess
import sys
import threading
import zlib

import pytest

from nsqpy.client import Consumer, Producer
from tests.client.helpers import addr, unique, wait_until


class Tool:
    """A utility as a subprocess whose stderr lines are collected, so a test can wait for its ready line."""

    def __init__(self, name, *args):
        self.proc = subprocess.Popen([sys.executable, "-m", f"nsqpy.tools.{name}", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        self.lines = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append(line.decode(errors="replace"))

    def wait_for_line(self, text, timeout=120):
        wait_until(lambda: any(text in line for line in self.lines) or self.proc.poll() is not None,
                   timeout=timeout, what=f"a line with {text!r}")
        assert any(text in line for line in self.lines), "".join(self.lines)

    def finish(self, timeout=120):
        """Wait for a clean exit (code 0); returns stdout."""
        out = self.proc.stdout.read()   # EOF when the process exits
        self.proc.wait(timeout)
        self._reader.join(timeout)
        assert self.proc.returncode == 0, "".join(self.lines)
        return out


def tool(name, *args, **kwargs):
    return subprocess.Popen([sys.executable, "-m", f"nsqpy.tools.{name}", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)


def finish(proc, timeout=120):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err.decode()
    return out, err


def subscribe(nsqd, topic, channel):
    """Create the channel first (SUB), so nothing published before the tool connects is lost to it."""
    c = Consumer(topic, channel, lambda m: None, nsqd_tcp_addresses=[addr(nsqd)], max_in_flight=0).start()
    c.stop()


def gunzip_so_far(data):
    """The text of a gzip file, also one still being written (no end marker yet); members one after another."""
    out = b""
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += d.decompress(data)
        data = d.unused_data
    return out


def output_lines(directory, gz=False):
    """The lines of every file in directory. While nsq_to_file runs, a file listed here may be rotated out of its
    work dir before it is opened: it is skipped then (read again from the output dir at the next poll)."""
    lines = []
    for name in sorted(os.listdir(directory)):
        try:
            with open(os.path.join(directory, name), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            continue
        lines.extend((gunzip_so_far(data) if gz else data).splitlines())
    return lines


@pytest.mark.parametrize("gz", [False, True])
def test_to_nsq_from_a_file_then_nsq_to_file_gives_the_input_back(shared_nsqd, tmp_path, gz):
    topic = unique("archive")
    lines = [b"line %05d %s" % (i, b"x" * (i % 50)) for i in range(2000)]
    src = tmp_path / "input.txt"
    src.write_bytes(b"\n".join(lines) + b"\n")
    out_dir, work_dir = tmp_path / "out", tmp_path / "work"
    subscribe(shared_nsqd, topic, "nsq_to_file")
    with open(src, "rb") as stdin:
        pub = subprocess.run([sys.executable, "-m", "nsqpy.tools.to_nsq", f"--topic={topic}",
                              f"--nsqd-tcp-address={addr(shared_nsqd)}"], stdin=stdin, capture_output=True)
    assert pub.returncode == 0, pub.stderr.decode()
    archiver = tool("nsq_to_file", f"--topic={topic}", f"--nsqd-tcp-address={addr(shared_nsqd)}",
                    f"--output-dir={out_dir}", f"--work-dir={work_dir}", "--rotate-size=20000",
                    "--sync-interval=0.5s", "--datetime-format=%Y", *(["--gzip"] if gz else []))
    try:
        # the open file lives in the work dir (synced every 0.5 s), closed ones move to the output dir
        wait_until(lambda: sum(len(output_lines(d, gz)) for d in (out_dir, work_dir) if d.exists()) >= 2000,
                   what="2000 lines written", timeout=120)
    finally:
        archiver.send_signal(signal.SIGTERM)
        _, err = finish(archiver)
    assert sorted(output_lines(out_dir, gz)) == sorted(lines)   # one consumer connection: order is NSQ's
    names = sorted(os.listdir(out_dir))
    assert len(names) > 2, names                                 # rotated by size
    assert all(n.startswith(f"{topic}.") and n.endswith(".log.gz" if gz else ".log") for n in names), names
    assert os.listdir(work_dir) == []
    assert b"wrote 2000 messages" in err


def test_nsq_tail_prints_n_messages_and_exits(shared_nsqd):
    topic = unique("tail")
    tail = Tool("nsq_tail", f"--topic={topic}", "--channel=tail#ephemeral",
                f"-nsqd-tcp-address={addr(shared_nsqd)}", "-n", "3", "--print-topic")
    tail.wait_for_line("connected to")       # SUB answered: the channel exists, nothing published is missed
    with Producer([addr(shared_nsqd)]) as p:
        p.mpub(topic, [b"m%d" % i for i in range(3)])
    out = tail.finish()
    assert out.splitlines() == [f"{topic} | m{k}".encode() for k in range(3)]


def test_long_running_tools_exit_cleanly_on_sigint_and_sigterm(shared_nsqd, tmp_path):
    topic = unique("sigint")
    tools = [Tool("nsq_tail", f"--topic={topic}", f"--nsqd-tcp-address={addr(shared_nsqd)}"),
             Tool("nsq_to_file", f"--topic={topic}", f"--nsqd-tcp-address={addr(shared_nsqd)}",
                  f"--output-dir={tmp_path}")]
    for t in tools:
        t.wait_for_line("connected to")
    with Producer([addr(shared_nsqd)]) as producer:
        producer.publish(topic, b"x")
    tools[0].proc.send_signal(signal.SIGINT)
    tools[1].proc.send_signal(signal.SIGTERM)
    assert tools[0].finish() == b"x\n"
    tools[1].finish()
    assert output_lines(tmp_path) == [b"x"]
