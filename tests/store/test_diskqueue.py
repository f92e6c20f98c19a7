"""NSQ's on-disk queue format (go-diskqueue) and nsqd.dat: nsqpy's reader and writer against a tiny independent
writer of the documented format (spec 12), file rolling, the meta read position, damaged files, the side file."""
import json
import os
import struct

import numpy as np
import pytest

from nsqpy.ipc import diskqueue_kernels as DK
from nsqpy.store import diskqueue as DQ
from nsqpy.store import metadata


def go_message(ts, attempts, msg_id, body):
    return struct.pack(">qH", ts, attempts) + msg_id + body


def go_write(directory, name, messages, per_file=None, read=(0, 0)):
    """A go-diskqueue writer in a few lines: records [int32 BE len][message], files rolled after per_file
    records, the meta file last."""
    per_file = per_file or len(messages) or 1
    num = pos = 0
    f = None
    for i, m in enumerate(messages):
        if f is None:
            f = open(os.path.join(directory, f"{name}.diskqueue.{num:06d}.dat"), "wb")
        f.write(struct.pack(">i", len(m)) + m)
        pos = f.tell()
        if (i + 1) % per_file == 0:
            f.close()
            f = None
            num, pos = num + 1, 0
    if f is not None:
        f.close()
    with open(os.path.join(directory, f"{name}.diskqueue.meta.dat"), "w") as f:
        f.write(f"{len(messages)}\n{read[0]},{read[1]}\n{num},{pos}\n")


def msgs(n, prefix=b"m"):
    return [go_message(1_700_000_000_000_000_000 + i, i % 3, b"%016x" % (0xabc000 + i), prefix + b"%d" % i)
            for i in range(n)]


def test_reader_reads_go_files_across_rolls(tmp_path):
    ms = msgs(25)
    go_write(tmp_path, "t:c", ms, per_file=7)
    assert DQ.queue_names(str(tmp_path)) == ["t:c"]
    got = [bytes(m) for m in DQ.DiskQueueReader(str(tmp_path), "t:c").messages()]
    assert got == ms
    ts, att, mid, body = DQ.decode_message(got[3])
    assert (ts, att, mid, body) == (1_700_000_000_000_000_003, 0, b"%016x" % 0xabc003, b"m3")


def test_reader_starts_at_the_meta_read_position(tmp_path):
    ms = msgs(10)
    first = 4 * (4 + len(ms[0]))   # the first four records of file 0 were read already
    go_write(tmp_path, "q", ms, read=(0, first))
    got = [bytes(m) for m in DQ.DiskQueueReader(str(tmp_path), "q").messages()]
    assert got == ms[4:]


def test_writer_output_is_what_the_go_format_says(tmp_path):
    w = DQ.DiskQueueWriter(str(tmp_path), "t", max_bytes_per_file=100)
    ms = msgs(12)
    for m in ms:
        ts, att, mid, body = DQ.decode_message(m)
        w.write_message(ts, att, mid, body)
    w.close()
    files = sorted(p for p in os.listdir(tmp_path) if p.endswith(".dat") and "meta" not in p)
    assert len(files) > 1  # rolled at 100 bytes
    raw = b"".join(open(tmp_path / p, "rb").read() for p in files)
    pos, back = 0, []
    while pos < len(raw):
        (n,) = struct.unpack_from(">i", raw, pos)
        back.append(raw[pos + 4:pos + 4 + n])
        pos += 4 + n
    assert back == ms
    depth, rnum, rpos, wnum, wpos = (int(x) for x in open(tmp_path / "t.diskqueue.meta.dat").read().replace(
        ",", "\n").split())
    assert (depth, rnum, rpos) == (12, 0, 0)
    last = tmp_path / f"t.diskqueue.{wnum:06d}.dat"
    assert wpos == (os.path.getsize(last) if last.exists() else 0)  # after a roll: the next file, not made yet


def test_writer_appends_after_an_existing_queue(tmp_path):
    go_write(tmp_path, "t", msgs(3, b"old"))
    w = DQ.DiskQueueWriter(str(tmp_path), "t", 1 << 20)
    for m in msgs(2, b"new"):
        w.write_message(*DQ.decode_message(m))
    w.close()
    bodies = [DQ.decode_message(m)[3] for m in DQ.DiskQueueReader(str(tmp_path), "t").messages()]
    assert bodies == [b"old0", b"old1", b"old2", b"new0", b"new1"]


@pytest.mark.parametrize("damage", ["garbage length", "cut short", "tiny length"])
def test_a_damaged_file_is_renamed_bad_and_the_rest_served(tmp_path, damage):
    ms = msgs(9)
    go_write(tmp_path, "t", ms, per_file=3)
    path = tmp_path / "t.diskqueue.000001.dat"
    data = bytearray(open(path, "rb").read())
    second = 4 + len(ms[3])
    if damage == "garbage length":
        data[second:second + 4] = b"\x7f\xff\xff\xff"
    elif damage == "cut short":
        data = data[:second + 10]
    else:
        data[second:second + 4] = struct.pack(">i", 3)
    open(path, "wb").write(bytes(data))
    r = DQ.DiskQueueReader(str(tmp_path), "t")
    got = [bytes(m) for m in r.messages()]
    assert got == ms[:4] + ms[6:]
    assert r.bad == [str(path)]
    assert os.path.exists(str(path) + ".bad") and not os.path.exists(path)


def test_deferred_side_file_round_trips(tmp_path):
    w = DQ.DiskQueueWriter(str(tmp_path), "t:c", 1 << 20)
    w.write_message(1, 0, b"%016x" % 5, b"x")
    w.defer([b"%016x" % 5], [123456789])
    w.close()
    assert DQ.DiskQueueReader(str(tmp_path), "t:c").deferred() == {b"%016x" % 5: 123456789}
    DQ.remove_queue(str(tmp_path), "t:c")
    assert os.listdir(tmp_path) == []


def test_kernels_convert_frames_and_scan_records():
    from nsqpy.protocol.frames import message_frame
    ms = [(10 + i, i, b"%016x" % (i + 1), b"body%d" % i * (i + 1)) for i in range(5)]
    frames = b"".join(message_frame(*m) for m in ms)
    buf = np.frombuffer(bytearray(frames), np.uint8).copy()
    end = DK.frames_to_records(buf, len(frames))
    records = bytes(buf[:end])
    expect = b"".join(struct.pack(">i", 26 + len(m[3])) + go_message(*m) for m in ms)
    assert records == expect
    cols = [np.zeros(8, np.int64) for _ in range(5)]
    n, pos, status = DK.scan_records(buf, 0, end, 1 << 20, *cols)
    assert (n, pos, status) == (5, end, DK.OK)
    off, ln, ts, att, ids = cols
    assert [bytes(buf[o:o + n]) for o, n in zip(off[:5], ln[:5])] == [m[3] for m in ms]
    assert ts[:5].tolist() == [m[0] for m in ms] and att[:5].tolist() == [m[1] for m in ms]
    assert ids[:5].tolist() == [1, 2, 3, 4, 5]
    assert DK.scan_records(buf, 0, end - 1, 1 << 20, *cols)[2] == DK.CUT
    bad = buf.copy()
    bad[0:4] = [0, 0, 0, 1]
    assert DK.scan_records(bad, 0, end, 1 << 20, *cols)[:3] == (0, 0, DK.BAD_LENGTH)


def test_metadata_is_nsqs_json_and_skips_ephemeral(tmp_path):
    topics = [metadata.TopicMeta("t", True, [metadata.ChannelMeta("c", True), metadata.ChannelMeta("e#ephemeral")]),
              metadata.TopicMeta("x#ephemeral")]
    metadata.save(str(tmp_path), topics, "1.3.0")
    doc = json.load(open(tmp_path / "nsqd.dat"))
    assert doc == {"topics": [{"channels": [{"name": "c", "paused": True}], "name": "t", "paused": True}],
                   "version": "1.3.0"}
    back = metadata.load(str(tmp_path))
    assert [(t.name, t.paused, [(c.name, c.paused) for c in t.channels]) for t in back] == [("t", True, [("c", True)])]
    (tmp_path / "nsqd.dat").write_text("{not json")
    with pytest.raises(ValueError):
        metadata.load(str(tmp_path))
    assert metadata.load(str(tmp_path / "missing")) == []
