"""Whether this node's claims are still its own, readable by the processes that run its jobs.

A job handed to an executor may wait there (in a prefork pool's queue) while the node's main
process is frozen or cut off from the database, long enough for the cluster to declare the
node dead and give the job to another node. Before a job starts, its executing process asks
the fence: the node's main process publishes, after each heartbeat, until when no other node
can have declared it dead (the heartbeat's start plus the grace period, less one heartbeat
interval), and the registration epoch it holds. A job claimed under that epoch, starting
before that moment, is still this node's; any other must have its claim read from the
database first.

The fence lives in one small shared memory block made before the pool forks, written by one
process and read by its children, with a sequence count so that a reader never acts on a
half-written value.
"""

from __future__ import annotations

import mmap
import os
import secrets
import struct
import threading

# sequence count, then: writer pid, node tag, epoch, safe until (monotonic seconds)
_SEQ = struct.Struct("=Q")
_FIELDS = struct.Struct("=qQqd")
_SIZE = _SEQ.size + _FIELDS.size


def new_tag() -> int:
    """A node's tag: tells apart the nodes of one process (tests run several)."""
    return secrets.randbits(63)


def stamp(tag: int, epoch: int) -> str:
    """What a job claimed by node ``tag`` under ``epoch`` carries to its executing process."""
    return f"{tag}:{epoch}"


class Fence:
    def __init__(self) -> None:
        self._block = mmap.mmap(-1, _SIZE)
        self._lock = threading.Lock()
        self._seq = 0

    def publish(self, tag: int, epoch: int, safe_until: float) -> None:
        """Jobs of node ``tag`` claimed under ``epoch`` may start unchecked until
        ``safe_until`` (monotonic). One writer at a time; readers never block it."""
        with self._lock:
            self._seq += 1  # odd: being written
            self._block[: _SEQ.size] = _SEQ.pack(self._seq)
            self._block[_SEQ.size : _SIZE] = _FIELDS.pack(os.getpid(), tag, epoch, safe_until)
            self._seq += 1  # even: complete
            self._block[: _SEQ.size] = _SEQ.pack(self._seq)

    def vouches(self, job_stamp: str | None, now: float) -> bool:
        """Whether a job stamped ``job_stamp`` (:func:`stamp`) may start without reading its
        claim: its node published that epoch, from this process or its parent, and the
        moment has not passed."""
        if not job_stamp:
            return False
        for _ in range(3):
            (before,) = _SEQ.unpack(self._block[: _SEQ.size])
            pid, tag, epoch, until = _FIELDS.unpack(self._block[_SEQ.size : _SIZE])
            (after,) = _SEQ.unpack(self._block[: _SEQ.size])
            if before == after and before % 2 == 0:
                break
        else:
            return False
        return (
            before > 0
            and pid in (os.getpid(), os.getppid())
            and stamp(tag, epoch) == job_stamp
            and now < until
        )


_current: Fence | None = None
_current_lock = threading.Lock()


def current_fence() -> Fence:
    """The fence of the worker in this process: made by the worker's main process before its
    pool forks, so that the pool's processes share it. Made afresh (vouching for nothing)
    where none was inherited."""
    global _current
    with _current_lock:
        if _current is None:
            _current = Fence()
        return _current
