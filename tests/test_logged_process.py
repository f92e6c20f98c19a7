"""A test's server process whose start fails (its start-up line never comes) is stopped, not left running."""
import pytest

from logged_process import LoggedProcess


def test_a_start_that_fails_stops_the_process():
    p = LoggedProcess("http.server", ["--bind", "127.0.0.1", "0"])
    p.wait_for_line("Serving HTTP on", timeout=60)  # it runs
    with pytest.raises(AssertionError, match="no line matching"):
        with p.starting():
            p.wait_for_line("a line it never prints", timeout=0.5)
    assert p.proc.poll() is not None  # stopped (SIGTERM) before the failure went on
