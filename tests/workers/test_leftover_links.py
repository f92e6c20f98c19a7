"""A dead instance's links segment counts as holding messages while a pub ring holds a record its owner never
released (an acknowledged message on its way to the topic's owner), so another nsqd's start keeps it for the
instance's own next start instead of removing it (workers/storage/leftovers.py, workers/publishing/links.py)."""
import os

from nsqpy.ipc.shm import Segment
from nsqpy.workers.publishing import links as L
from nsqpy.workers.storage import leftovers


def test_a_record_in_any_pub_ring_holds_messages_until_its_owner_releases_it():
    name = f"/nsqpy-test{os.getpid()}-links-0"
    seg = Segment.create(name, L.nbytes(2, 3, 1 << 16), reserve=0)
    try:
        link_set = L.LinkSet.create(seg, 2, 3, 1 << 16, seg.reserver())
        assert not L.holds_records(seg.buf) and not leftovers.holds_messages(name)
        for slot, owner in ((2, 0), (0, 1)):  # another process's slot, and one worker forwarding to the other
            assert link_set.pub(slot, owner).send(1, b"a forwarded PUB")
            assert L.holds_records(seg.buf) and leftovers.holds_messages(name)
            got = []
            assert link_set.pub(slot, owner).drain(lambda t, p: got.append(bytes(p))) == 1
            assert got == [b"a forwarded PUB"]
            assert not leftovers.holds_messages(name)
        link_set.to_scanner(0).send(1, b"timers")  # not a message: the scanner's rings do not count
        assert not leftovers.holds_messages(name)
    finally:
        seg.close()
        seg.unlink()


def test_a_links_segment_never_stamped_holds_nothing_and_one_that_cannot_be_read_is_kept():
    name = f"/nsqpy-test{os.getpid()}-links-1"
    seg = Segment.create(name, 1 << 16)
    try:
        assert not L.holds_records(seg.buf)  # zeros: its instance died before it made its rings
        seg.buf[:8] = 255  # a header this code cannot read (another layout's magic)
        assert L.holds_records(seg.buf)
        assert leftovers.holds_messages(name)
    finally:
        seg.close()
        seg.unlink()
    assert not leftovers.holds_messages(name)  # gone: nothing to keep
