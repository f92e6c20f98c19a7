"""A cold cache's compile says how far it is: one line per finished warm-up step, counted in the order the steps
finish whichever process compiled them (``warmup.Progress``, fed by the compiling children's reports in
``warmup._compile_in_parallel``), so that a first start's or ``nsqd --compile-only``'s tens of seconds are not
silent. And the loads run without llvmlite's lock callbacks, which are put back afterwards (``quiet_llvm_lock``).

The steps here are plain functions (no kernel: the scheduling is what is tested), run by real forked processes
from the real queue; each writes a file, and a step that waits for another checks that the other's file is there.
"""
import mmap
import re

from nsqpy.log import Logger
from nsqpy.workers.lane import warmup


def _logger(path):
    stream = open(path, "w")
    return Logger("[test] ", "info", stream), stream


def test_progress_counts_each_finished_step_with_its_time_and_the_time_so_far(tmp_path):
    log, stream = _logger(tmp_path / "log")
    now = [100.0]
    progress = warmup.Progress(3, log, clock=lambda: now[0])
    now[0] = 104.4
    progress.step("ipc.msglog.warm_up", 4.42)
    now[0] = 107.0
    progress.step("ipc.ring.warm_up", 2.6)
    stream.close()
    lines = (tmp_path / "log").read_text().splitlines()
    assert [line.split("INFO: ")[1] for line in lines] == [
        "compiled 1/3: ipc.msglog.warm_up (4.4s), 4.4s so far",
        "compiled 2/3: ipc.ring.warm_up (2.6s), 7.0s so far"]
    assert warmup.Progress(2, None).step("x", 1.0) is None  # no log: counted, nothing printed


def _step(directory, name, waits_for=()):
    def step():
        for other in waits_for:  # its dependencies ran before it (the queue's waits_for)
            assert (directory / other.__name__).exists(), f"{name} ran before {other.__name__}"
        (directory / name).write_text(name)
    step.__name__ = step.__qualname__ = name
    step.warm_up_shm, step.warm_up_waits_for, step.warm_up_deferred = False, tuple(waits_for), None
    return step


def test_parallel_compile_reports_every_step_once_in_the_order_they_finish(tmp_path):
    first = _step(tmp_path, "first")
    steps = [first, _step(tmp_path, "second"), _step(tmp_path, "third", waits_for=(first,)),
             _step(tmp_path, "fourth"), _step(tmp_path, "fifth")]
    log, stream = _logger(tmp_path / "log")
    done = mmap.mmap(-1, len(steps))
    progress = warmup.Progress(len(steps), log)
    warmup._compile_in_parallel(steps, list(range(len(steps))), 2, done, progress)
    stream.close()
    text = (tmp_path / "log").read_text()
    assert "failed" not in text  # every child exited 0: no step raised (the waiting one found its dependency)
    reported = re.findall(r"compiled (\d)/5: \S+\.(\w+) \([0-9.]+s\), [0-9.]+s so far", text)
    assert [int(n) for n, _ in reported] == [1, 2, 3, 4, 5]
    assert sorted(name for _, name in reported) == sorted(s.__name__ for s in steps)
    assert bytes(done) == b"\1" * len(steps) and progress.finished == len(steps)
    assert all((tmp_path / s.__name__).exists() for s in steps)


def test_a_failing_step_is_reported_as_a_failed_process_and_the_others_still_run(tmp_path):
    def broken():
        raise RuntimeError("no")
    broken.warm_up_shm, broken.warm_up_waits_for, broken.warm_up_deferred = False, (), None
    steps = [broken, _step(tmp_path, "other")]
    log, stream = _logger(tmp_path / "log")
    done = mmap.mmap(-1, len(steps))
    warmup._compile_in_parallel(steps, [0, 1], 2, done, warmup.Progress(2, log))
    stream.close()
    text = (tmp_path / "log").read_text()
    assert "1 of 2 kernel-compiling processes failed; compiling the rest here" in text
    assert "compiled 1/2: " in text and "other" in text  # the step that ran is reported, the broken one not
    assert bytes(done) == b"\1\1"  # the broken one is marked too: nothing waits for it forever


def test_loads_run_without_llvmlites_lock_callbacks_which_come_back_afterwards():
    from llvmlite.binding import ffi
    before = list(ffi.lib._lock._cblist)
    assert before  # numba registers its llvm_lock event pair at import
    with warmup.quiet_llvm_lock():
        assert ffi.lib._lock._cblist == []
    assert ffi.lib._lock._cblist == before
    try:
        with warmup.quiet_llvm_lock():
            raise KeyError("a failing load")
    except KeyError:
        pass
    assert ffi.lib._lock._cblist == before
