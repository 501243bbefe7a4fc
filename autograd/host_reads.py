"""Reads from a device to the host, counted. Each one makes the host wait until the GPU has finished
all the work queued before it, so a training step should make none. They all go through
backend.to_host, which counts them here, so that a test can check that a step makes none:

    with host_reads.counting() as reads:
        step()
    assert reads.count == 0
"""

_count = 0


def one_more():
    """Count one read (backend.to_host's)."""
    global _count
    _count += 1


def total():
    """How many reads this process has made."""
    return _count


class counting:
    """`with counting() as reads: ...`, then `reads.count` is the number of reads made in the block."""

    def __enter__(self):
        self.start = _count
        return self

    def __exit__(self, *exc_info):
        self.count = _count - self.start
