"""The one-writer row tables of the stats plane (ipc/statrows.py).

What must hold: a reader's copy of a row is always one whole state the writer published (never half of two
updates, never a reused row's old name with its new counters), also while a writer in another process updates,
creates and frees rows as fast as it can, and after that writer is SIGKILLed at any moment; a dead writer never
makes a reader wait; tables grow by generations that readers follow; requests are answered through the board."""
import mmap
import os
import random
import signal
import time

import numpy as np
import pytest

from nsqpy.ipc.shm import list_segments
from nsqpy.ipc.statrows import (B_GEN, B_PID, BODY_WORDS, COPY_A, COPY_B, COPY_WORDS, IMMUTABLE_WORDS, R_BODY, R_GEN,
                          R_KIND, R_UID, ROWS_AT, ROW_WORDS, Board, RowReader, RowTable, RowWriter, counters_of,
                          warm_up, writer_alive)
from tests.ipc._fork import fork, wait

KIND = 7


@pytest.fixture
def names(shm_prefix):
    """Table names under this test's prefix; whatever a test leaves (a killed writer's table) goes at teardown."""
    yield lambda gen: f"/{shm_prefix}-rows-{gen}"
    unlink_all(shm_prefix)


@pytest.fixture
def board():
    # anonymous shared memory: a forked writer's board words must reach the parent (as the Plan's segment does)
    return Board.create(np.frombuffer(mmap.mmap(-1, Board.nbytes(2)), np.uint8), 2)


def unlink_all(prefix):
    for name in list_segments("/" + prefix):
        os.unlink("/dev/shm" + name)



def body_for(uid, counters):
    """The immutable words say which uid they belong to (so a reader can tell a mixed-up copy)."""
    return [uid & 0xFFFFFFFF] * IMMUTABLE_WORDS + list(counters)


def consistent(rows):
    """Every copied row: immutable words name its own uid, and its readable counters are one whole update."""
    c = counters_of(rows)
    for row, cnt in zip(rows, c):
        assert (row[R_BODY:R_BODY + IMMUTABLE_WORDS] == (row[R_UID] & 0xFFFFFFFF)).all(), row
        assert (cnt == cnt[0] + np.arange(COPY_WORDS)).all(), (row, cnt)
    return c


def test_rows_round_trip_update_free_and_reuse(board, shm_prefix, names):
    w = RowWriter(board, 0, names)
    r = RowReader(board, 0, names)
    assert board.gen(0) == 0 and r.rows().shape == (0, ROW_WORDS)  # no table before the first row
    made = [w.create(KIND, body_for(0, range(COPY_WORDS))) for _ in range(10)]
    w.flush()
    rows = r.rows()
    assert rows.shape == (10, ROW_WORDS) and sorted(rows[:, R_UID].tolist()) == sorted(u for _, u in made)
    for k, (idx, _) in enumerate(made):
        w.update(idx, tuple(100 * k + j for j in range(COPY_WORDS)))
    w.flush()
    c = counters_of(r.rows())
    assert sorted(c[:, 0].tolist()) == [100 * k for k in range(10)]
    for idx, _ in made[:4]:
        w.free(idx)
    w.flush()
    assert len(r.rows()) == 6
    again = [w.create(KIND, body_for(0, [5] * COPY_WORDS)) for _ in range(4)]
    w.flush()
    assert {i for i, _ in again} == {i for i, _ in made[:4]}  # freed rows are reused...
    uids = r.rows()[:, R_UID].tolist()
    assert len(set(uids)) == 10 and not {u for _, u in made[:4]} & set(uids)  # ...under new uids
    w.close()
    r.close()


def test_tables_grow_by_generations_and_readers_follow(board, shm_prefix, names):
    w = RowWriter(board, 1, names)
    first = w.generation
    r = RowReader(board, 1, names)
    rows = []
    for n in (1, 63, 64, 200, 1000):
        while len(rows) < n:
            rows.append(w.create(KIND, body_for(len(rows), [len(rows)] * COPY_WORDS))[0])
        w.flush()
        got = r.rows()
        assert len(got) == n and sorted(counters_of(got)[:, 0].tolist()) == list(range(n))
    assert w.table.capacity == 1024 and board.gen(1) == w.table.generation
    # only the current generation exists: every older one was unlinked when the next was published
    assert list_segments("/" + shm_prefix) == [names(board.gen(1))]
    r.close()
    w.close()
    # a restarted writer (same board line) removes its predecessor's table and starts over with new uids
    w2 = RowWriter(board, 1, names)
    assert board.gen(1) == 0 and list_segments("/" + shm_prefix) == []
    idx, uid = w2.create(KIND, body_for(0, range(COPY_WORDS)))
    w2.flush()
    assert first < uid >> 40 < board.gen(1) and r.rows()[:, R_UID].tolist() == [uid]
    w2.close()
    r.close()


def _churn(board_buf, prefix, seconds):
    """Writer child: create, update (every counter = v + column) and free rows as fast as it can."""
    board = Board.attach(board_buf)
    w = RowWriter(board, 0, lambda gen: f"/{prefix}-rows-{gen}")
    rng = random.Random(os.getpid())
    live = {}
    v = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(rng.randint(1, 40)):
            op = rng.random()
            if op < 0.3 or not live:
                idx, uid = w.create(KIND, body_for(w._uid + 1, [v + j for j in range(COPY_WORDS)]))
                live[idx] = uid
            elif op < 0.9:
                idx = rng.choice(list(live))
                v += 1
                w.update(idx, tuple(v + j for j in range(COPY_WORDS)))
            else:
                idx = rng.choice(list(live))
                del live[idx]
                w.free(idx)
        w.flush()
    # leave the table for the parent (it unlinks it)


def test_concurrent_writer_never_shows_a_torn_row(board, shm_prefix, names):
    warm_up()
    pid = fork(_churn, board.w.view(np.uint8), shm_prefix, 3.0)
    r = RowReader(board, 0, names)
    reads = seen = 0
    status = None
    try:
        deadline = time.monotonic() + 60
        while status is None and time.monotonic() < deadline:
            rows = r.rows()
            consistent(rows)
            reads += 1
            seen += len(rows)
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
    finally:
        if status is None:
            status = wait(pid, 60)
    assert status == 0
    assert reads > 10 and seen > 0 and r.torn == 0
    consistent(r.rows())
    r.close()


def _churn_forever(board_buf, prefix):
    _churn(board_buf, prefix, 3600)


def test_a_writer_killed_at_any_moment_leaves_whole_rows(board, shm_prefix, names):
    """SIGKILL the writer again and again at random moments; each time the reader must get a consistent copy at
    once (no waiting on the dead writer), and the next writer starts clean."""
    rng = random.Random(1)
    warm_up()  # compiled before fork: a child killed while numba writes its cache must not be the first to compile
    r = RowReader(board, 0, names)
    for _ in range(8):
        pid = fork(_churn_forever, board.w.view(np.uint8), shm_prefix)
        try:
            deadline = time.monotonic() + 60
            while board.word(0, B_PID) != pid:
                rows = r.rows()  # the predecessor's table, or nothing: never torn
                consistent(rows)
                assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the writer died by itself"
                assert time.monotonic() < deadline, "the writer never started"
            assert writer_alive(board, 0)
            stop = time.monotonic() + rng.uniform(0.01, 0.3)
            while time.monotonic() < stop:
                consistent(r.rows())
        finally:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        assert not writer_alive(board, 0)
        t0 = time.monotonic()
        consistent(r.rows())
        assert time.monotonic() - t0 < 5  # a copy, not a wait (generous: a loaded VM)
    assert r.torn == 0
    r.close()


def test_half_written_rows_are_invisible(board, shm_prefix, names):
    """The states a writer dying inside a kernel would leave, made by hand: a create that did not reach KIND, and
    an update that did not reach GEN. Readers see no row, and the last whole counters."""
    w = RowWriter(board, 0, names)
    r = RowReader(board, 0, names)
    idx, uid = w.create(KIND, body_for(0, [1] * COPY_WORDS))
    w.flush()
    tbl = w.table.tbl
    row = ROWS_AT + idx * ROW_WORDS
    # an update in progress: the unread copy is half rewritten, GEN not bumped yet
    spare = COPY_B if tbl[row + R_GEN] % 2 == 0 else COPY_A
    tbl[row + spare:row + spare + 4] = 99
    assert counters_of(r.rows())[0].tolist() == [1] * COPY_WORDS
    # a create in progress on a fresh row: UID and part of the body written, KIND still 0
    spare_row = ROWS_AT + (idx + 1) * ROW_WORDS
    tbl[spare_row + R_UID] = uid + 1
    tbl[spare_row + R_BODY:spare_row + R_BODY + 5] = 42
    w.hwm += 1
    tbl[16] = w.hwm  # T_HWM: the dead writer had published the high-water mark already
    rows = r.rows()
    assert rows[:, R_UID].tolist() == [uid] and rows[0, R_KIND] == KIND
    w.close()
    r.close()


def test_requests_and_answers_on_the_board(board):
    before = board.done(1)
    t1 = board.take_ticket(1)
    t2 = board.take_ticket(1)
    assert t2 == t1 + 1 and board.done(1) == before < t1
    view = board.request_view(1)
    assert int(view[0]) == t2  # what the writer compares once per iteration
    board.set_word(1, 1, int(view[0]))  # B_DONE: the writer answers every request up to what it read
    assert board.done(1) >= t2
    assert Board.attach(board.w.view(np.uint8)).writers == 2
    assert not writer_alive(board, 0)  # no writer ever registered


def test_layout_constants_fit():
    assert COPY_A == R_BODY + IMMUTABLE_WORDS and COPY_B + COPY_WORDS == ROW_WORDS
    assert BODY_WORDS == ROW_WORDS - R_BODY and B_GEN == 0
    assert RowTable.nbytes(64) == 8 * (ROWS_AT + 64 * ROW_WORDS)


def test_a_hundred_thousand_rows(board, names):
    """100,000 topics' rows fit: the table grows to them (and no further than the next power of two), a reader
    copies them all, and updating a few costs a few."""
    w = RowWriter(board, 0, names)
    r = RowReader(board, 0, names)
    made = [w.create(KIND, body_for(0, (k,) * COPY_WORDS))[0] for k in range(100_000)]
    w.flush()
    assert w.table.capacity == 131072 and len(r.rows()) == 100_000
    for idx in made[:10]:
        w.update(idx, (7,) * COPY_WORDS)
    assert w.flush() == 10
    got = counters_of(r.rows())[:, 0]
    assert (got == 7).sum() == 10 and (got[10:] == np.arange(10, 100_000)).all()
    w.close()
    r.close()
