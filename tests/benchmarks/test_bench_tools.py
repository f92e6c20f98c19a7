"""The benchmark tools against their stand-in servers: real processes on port 0, each server waited on through
its `TCP: listening on` line, each tool run for about a second as a subprocess printing its JSON line.

No broker is needed here; the runs against nsqd/nsqpy are the lead's.
"""

from __future__ import annotations

import json
import socket
import threading

import pytest

from benchmarks import compare, first_start, latency, make_table
from benchmarks.process import ListeningProcess, python_module, run_tool

RUN = ["--runfor", "1s", "--connections", "2"]


def serve(*args: str) -> ListeningProcess:
    return ListeningProcess(python_module(*args), ready_timeout=60)


@pytest.fixture
def sink():
    with serve("benchmarks.sink_server", "--processes", "2") as server:
        yield server


def assert_rates(result: dict) -> None:
    assert result["errors"] == 0, result.get("first_error")
    assert result["msgs"] > 0 and result["ops_per_s"] > 0 and result["mib_per_s"] > 0 and result["us_per_op"] > 0


def test_writer_mpub_against_sink_every_message_arrives(tmp_path):
    out = tmp_path / "w.json"
    with serve("benchmarks.sink_server", "--processes", "1") as server:
        code, result = run_tool("benchmarks.bench_writer", "--nsqd-tcp-address", server.address_text, *RUN,
                                "--no-ceiling", "--out", str(out), timeout=60)
    assert code == 0
    assert_rates(result)
    assert result["batch_size"] == 200 and result["msgs"] % 200 == 0
    assert json.loads(out.read_text()) == result
    counters = server.json_result()
    assert counters["msgs_in"] == result["msgs"] and counters["errors"] == 0
    assert counters["bytes_in"] == result["msgs"] * 200


def test_writer_single_pub_with_ceiling(sink):
    code, result = run_tool("benchmarks.bench_writer", "--nsqd-tcp-address", sink.address_text, *RUN,
                            "--batch-size", "1", "--ceiling-runfor", "300ms", timeout=60)
    assert code == 0
    assert_rates(result)
    assert result["batch_size"] == 1
    assert result["ceiling_ops_per_s"] > 0 and result["ceiling_errors"] == 0


def test_reader_against_source():
    with serve("benchmarks.source_server", "--processes", "2") as server:
        code, result = run_tool("benchmarks.bench_reader", "--nsqd-tcp-address", server.address_text, *RUN,
                                "--ceiling-runfor", "300ms", timeout=60)
    assert code == 0
    assert_rates(result)
    assert result["ceiling_ops_per_s"] > 0
    assert server.json_result()["fins"] >= result["msgs"]


def test_reader_count_receives_exactly_the_count():
    count = 54321
    with serve("benchmarks.source_server", "--messages", str(count)) as server:
        code, result = run_tool("benchmarks.bench_reader", "--nsqd-tcp-address", server.address_text,
                                "--runfor", "20s", "--connections", "2", "--count", str(count), "--no-ceiling",
                                timeout=60)
    assert code == 0
    assert result["msgs"] == count and result["errors"] == 0
    counters = server.json_result()
    assert counters["msgs_out"] == count and counters["fins"] == count


def test_reader_count_fails_when_messages_are_missing():
    with serve("benchmarks.source_server", "--messages", "1000") as server:
        code, result = run_tool("benchmarks.bench_reader", "--nsqd-tcp-address", server.address_text,
                                "--runfor", "500ms", "--connections", "1", "--count", "1001", "--no-ceiling",
                                timeout=60)
    assert code == 1 and result["msgs"] == 1000


def test_latency_against_relay_both_modes_with_ceiling():
    with serve("benchmarks.source_server", "--relay") as server:
        code, result = run_tool("benchmarks.latency", "--nsqd-tcp-address", server.address_text,
                                "--rates", "1000,5000", "--runfor", "300ms", "--ceiling-runfor", "200ms", timeout=90)
    assert code == 0 and result["errors"] == 0 and result["ceiling_errors"] == 0
    assert result["modes"] == ["defaults", "unbuffered"]
    assert result["identify"] == {"defaults": {"output_buffer_size": 16384, "output_buffer_timeout": 250},
                                  "unbuffered": {"output_buffer_size": -1, "output_buffer_timeout": 250}}
    shape = [("defaults", 1000), ("defaults", 5000), ("unbuffered", 1000), ("unbuffered", 5000)]
    assert [(p["mode"], p["rate"]) for p in result["phases"]] == shape
    assert [(p["mode"], p["rate"]) for p in result["ceiling"]] == shape  # reported beside, not subtracted
    for phase, seconds in [(p, 0.3) for p in result["phases"]] + [(p, 0.2) for p in result["ceiling"]]:
        assert phase["sent"] == phase["received"] == int(phase["rate"] * seconds) and phase["lost"] == 0
        assert 0 < phase["p50_us"] <= phase["p99_us"] <= phase["p999_us"] <= phase["max_us"]
        assert phase["cdf_us"] == sorted(phase["cdf_us"])


def test_latency_one_mode_only():
    with serve("benchmarks.source_server", "--relay") as server:
        code, result = run_tool("benchmarks.latency", "--nsqd-tcp-address", server.address_text, "--modes",
                                "unbuffered", "--rates", "2000", "--runfor", "300ms", "--no-ceiling", timeout=60)
    assert code == 0 and result["errors"] == 0 and "ceiling" not in result
    (phase,) = result["phases"]
    assert phase["mode"] == "unbuffered" and phase["rate"] == 2000 and phase["received"] == 600


@pytest.mark.parametrize("mode", sorted(latency.MODES))
def test_latency_consumer_identify_carries_the_mode(mode):
    """What the consumer's IDENTIFY body says, read off the wire by a one-shot server."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        got = {}

        def serve_once():
            conn, _ = listener.accept()
            with conn, conn.makefile("rb") as f:
                assert f.read(4) == b"  V2" and f.readline() == b"IDENTIFY\n"
                got.update(json.loads(f.read(int.from_bytes(f.read(4), "big"))))
                conn.sendall((6).to_bytes(4, "big") + (0).to_bytes(4, "big") + b"OK")

        thread = threading.Thread(target=serve_once, daemon=True)
        thread.start()
        latency.ConsumerConnection(listener.getsockname(), latency.MODES[mode]).close()
        thread.join(5)
    assert got["feature_negotiation"] is False
    expected = {"defaults": (16384, 250), "unbuffered": (-1, 250)}[mode]
    assert (got["output_buffer_size"], got["output_buffer_timeout"]) == expected


def test_compare_reports_latency_per_mode():
    runs = [{"target": t, "scenario": "latency", "mode": m, "result": {"p99_us": v}}
            for t, m, v in [("nsqpy", "defaults", 100.0), ("nsqpy", "defaults", 300.0), ("go", "defaults", 400.0),
                            ("nsqpy", "unbuffered", 50.0), ("go", "unbuffered", 25.0)]]
    runs.append({"target": "nsqpy", "scenario": "pub", "result": {"ops_per_s": 10.0}})
    runs.append({"target": "go", "scenario": "pub", "result": {"ops_per_s": 20.0}})
    runs.append({"target": "nsqpy", "scenario": "roundtrip", "result": {"us_per_round_trip": 90.0}})
    runs.append({"target": "go", "scenario": "roundtrip", "result": {"us_per_round_trip": 45.0}})
    table = compare.figures(["defaults", "unbuffered"])
    medians, ratios = compare.summarize(runs, ["nsqpy", "go"], table)
    assert medians["latency_defaults"] == {"nsqpy": 200.0, "go": 400.0}
    assert medians["latency_unbuffered"] == {"nsqpy": 50.0, "go": 25.0}
    assert ratios["latency_defaults"] == {"go": 0.5} and ratios["latency_unbuffered"] == {"go": 2.0}
    assert ratios["pub"] == {"go": 0.5} and "latency" not in medians
    assert ratios["roundtrip"] == {"go": 2.0}  # nsqpy's time over Go's: above 1 is slower


def test_compare_rotates_the_targets_order_each_round():
    names = ["nsqpy", "before", "go"]
    orders = [compare.round_order(names, r) for r in range(4)]
    assert orders == [names, ["before", "go", "nsqpy"], ["go", "nsqpy", "before"], names]
    assert [o[0] for o in orders[:3]] == ["nsqpy", "before", "go"]  # each target runs first once in 3 rounds


def test_compare_keys_latency_by_mode_and_rate_when_several_rates():
    table = compare.figures(["unbuffered"], [1000, 100000], ["pub", "latency"])
    assert list(table) == ["pub", "latency_unbuffered_1000", "latency_unbuffered_100000"]
    runs = [{"target": t, "scenario": "latency", "mode": "unbuffered", "rate": r, "key": f"latency_unbuffered_{r}",
             "result": {"p99_us": v}} for t, r, v in [("nsqpy", 1000, 10.0), ("go", 1000, 20.0),
                                                        ("nsqpy", 100000, 30.0), ("go", 100000, 15.0)]]
    _, ratios = compare.summarize(runs, ["nsqpy", "go"], table)
    assert ratios["latency_unbuffered_1000"] == {"go": 0.5} and ratios["latency_unbuffered_100000"] == {"go": 2.0}
    assert compare.parser().parse_args(["--scenarios", "latency", "--latency-rate", "1000,100000"]).latency_rate \
        == [1000, 100000]
    with pytest.raises(SystemExit):
        compare.parser().parse_args(["--scenarios", "reader"])   # reader reads what writer wrote


def test_first_start_prediction_hands_each_step_to_the_first_free_process():
    # as the warm-up's queue: 5 and 4 start; 3 goes to the one free at 4, 2 to the one free at 5
    assert first_start.predicted_kernels_s([5, 4, 3, 2], 2) == 7
    assert first_start.predicted_kernels_s([5, 4, 3, 2], 1) == 14
    assert first_start.predicted_kernels_s([5, 4, 3, 2], 64) == 5
    # a waiting step starts once the steps it waits for are done: the 2 waits in the process free at 4 until 5,
    # and the 3 goes to the one free at 5
    assert first_start.predicted_kernels_s([5, 4, 2, 3], 2, waits={2: (0, 1)}) == 8
    assert first_start.predicted_kernels_s([5, 4, 2, 3], 64, waits={2: (0, 1)}) == 7
    # waiting for the 4 only: it starts at 4 in that process, and the 3 goes to the one free at 5
    assert first_start.predicted_kernels_s([5, 4, 2, 3], 2, waits={2: (1,)}) == 8
    assert first_start.predicted_kernels_s([5, 4, 2, 3], 64, waits={2: (1,)}) == 6


def test_first_start_predicts_listening_without_the_deferred_steps():
    """predictions() maps the steps' own indices (and waits) onto a subset: the steps nsqd waits for."""
    steps = [{"index": 0, "s": 5, "waits": []}, {"index": 3, "s": 4, "waits": []},
             {"index": 4, "s": 9, "waits": [0, 3]}, {"index": 5, "s": 1, "waits": []}]
    assert first_start.predictions(steps)[64] == 14  # the 9 waits for the 5 and the 4
    assert first_start.predictions([steps[0], steps[1], steps[3]])[64] == 5
    assert first_start.predictions([steps[0], steps[1], steps[3]])[1] == 10


def test_make_table_rewrites_only_between_the_markers(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    writer = {"tool": "bench_writer", "batch_size": 200, "connections": 2, "size": 200, "ops_per_s": 1234567.0,
              "mib_per_s": 235.5, "us_per_op": 0.81, "ceiling_ops_per_s": 2000000.0, "errors": 0,
              "when": "2026-11-21T00:00:00Z"}
    latency = {"tool": "latency", "when": "w", "phases": [
        {"rate": 10000, "achieved_rate": 9999.0, "p50_us": 210.0, "p99_us": 900.0, "p999_us": 1500.0,
         "max_us": 2100.0, "lost": 0}]}
    pubs = {"tool": "pub_compare", "servers": {"go": "y", "nsqpy": "x"}, "commit": "abc1234",  # as emitted: sorted
            "medians": {"2": {"go": 25000.0, "nsqpy": 20000.0}}, "ratios": {"2": {"go": 0.8}},
            "server_cpu_us_per_msg": {"2": {"go": 30.0, "nsqpy": 40.04}}}
    (results / "w1.json").write_text(json.dumps(writer) + "\n")
    (results / "lat.json").write_text("not json\n" + json.dumps(latency) + "\n")
    (results / "pc.json").write_text(json.dumps(pubs) + "\n")
    reads = {**pubs, "read_preload": 6000000, "rdy": 2500, "batch_size": 1}
    (results / "rd.json").write_text(json.dumps(reads) + "\n")
    readme = tmp_path / "README.md"
    readme.write_text(f"# head\n\n{make_table.BEGIN}\nold table\n{make_table.END}\n\ntail\n")
    make_table.main(["--results", str(results), "--readme", str(readme)])
    text = readme.read_text()
    assert text.startswith(f"# head\n\n{make_table.BEGIN}\n") and text.endswith(f"{make_table.END}\n\ntail\n")
    assert "old table" not in text
    assert "| w1 | bench_writer | MPUB 200 | 2 | 200 | 1,234,567 | 235.5 | 0.810 | 2,000,000 | 0 |" in text
    assert "| lat | defaults | 10,000 | 9,999 | 210 | 900 | 1,500 | 2,100 | 0 | w |" in text
    assert "| pc | PUB | 2 | nsqpy | 20,000 | 40.0 |  | abc1234 |" in text  # the first --server: no ratio
    assert "| pc | PUB | 2 | go | 25,000 | 30.0 | 0.800 | abc1234 |" in text
    assert "| rd | read RDY 2500 | 2 | go | 25,000 | 30.0 | 0.800 | abc1234 |" in text
    make_table.main(["--results", str(results), "--readme", str(readme)])
    assert readme.read_text() == text  # idempotent


def test_a_server_that_ignores_sigterm_is_killed_with_its_whole_process_group():
    """stop() waits stop_timeout for a clean exit, then SIGKILLs the process group: no child outlives it (a
    broker's workers would otherwise keep running, and keep their shared memory)."""
    import sys

    from tests.polling import wait_until
    script = ("import os, signal, subprocess, sys, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "child = subprocess.Popen([sys.executable, '-c', "
              "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
              "print(child.pid, flush=True)\n"
              "sys.stderr.write('TCP: listening on 127.0.0.1:1\\n'); sys.stderr.flush()\n"
              "time.sleep(600)\n")
    server = ListeningProcess([sys.executable, "-c", script], ready_timeout=60, stop_timeout=0.5).start()
    wait_until(lambda: server._stdout, what="the child's pid")
    child = int(server._stdout[0])
    assert server.stop() == -9

    def gone():
        try:
            with open(f"/proc/{child}/stat") as f:
                return f.read().split(") ", 1)[1][0] == "Z"   # killed, not yet reaped by init
        except FileNotFoundError:
            return True
    wait_until(gone, what="the child killed with its parent")
