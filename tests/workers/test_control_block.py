"""workers/control/block.py's per-worker flags: one word, written by its worker only, each bit read by the others."""
import types

from nsqpy.workers.control.block import Control, nbytes


def test_quiesced_and_busy_are_separate_bits_of_one_worker_word():
    c = Control.create(types.SimpleNamespace(buf=bytearray(nbytes(3))), 3)
    c.set_busy(1, True)
    c.set_quiesced(1, True)
    c.set_busy(1, False)
    assert c.quiesced(1) and not c.busy(1)
    c.set_busy(1, True)
    c.set_quiesced(1, False)
    assert c.busy(1) and not c.quiesced(1)
    assert not c.busy(0) and not c.busy(2) and not c.quiesced(2)  # the other workers' words
    c.add_moved_in(1, 2)
    c.clear_flags(1)  # a worker (or its replacement) starting
    assert not c.busy(1) and not c.quiesced(1) and c.moved_in(1) == 2
