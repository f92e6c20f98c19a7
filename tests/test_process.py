"""nsqpy.process.wait_for_exits: every exit wakes the wait (pidfds), the deadline returns the ones still running,
and nothing is reaped (the caller's waitpid still gets each status)."""
import os
import time

from nsqpy.process import wait_for_exits


def _child(exit_code, gate=None):
    """A child that exits with ``exit_code`` at once, or once the parent closes the write end of ``gate`` (a
    pipe: (read end, write end))."""
    pid = os.fork()
    if pid == 0:
        if gate is not None:
            os.close(gate[1])
            os.read(gate[0], 1)  # blocks until the parent closes its write end
        os._exit(exit_code)
    return pid


def test_the_exited_are_waited_for_and_the_running_returned_at_the_deadline():
    r, w = os.pipe()
    try:
        quick = [_child(0), _child(3)]
        held = _child(0, gate=(r, w))
        assert wait_for_exits(quick, time.monotonic() + 60) == []
        assert [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in quick] == [0, 3]  # not reaped before
        assert wait_for_exits([held], time.monotonic() + 0.05) == [held]
    finally:
        os.close(w)
    assert wait_for_exits([held], time.monotonic() + 60) == []
    assert os.waitpid(held, 0)[0] == held


def test_an_already_reaped_child_counts_as_exited():
    pid = _child(0)
    os.waitpid(pid, 0)
    assert wait_for_exits([pid], time.monotonic() + 60) == []
