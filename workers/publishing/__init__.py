"""Publishing: PUB/MPUB/DPUB appended at the topic's owner or forwarded to it, the ring records that carry them, the
rings."""
