"""A pool process's plain success, carried back to the worker's main process.

In a prefork pool process the node's settler is out of reach (it is a thread of the main
process). Rather than write each success in a transaction of its own, the pool process keeps
the encoded result aside while the task's trace runs (:func:`keep`), and the trace's return,
which billiard's result pipe takes back to the main process anyway, carries it
(:class:`CarriedResult`). There the request hands it to the settler, as the backend does for a
success in the main process (``-P threads``, ``solo``, ``gevent``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery_ratchet.celery.send.sender import BEFORE_KEYED_SEND
from celery_ratchet.domain.job import JobStatus, StoredResult

logger = logging.getLogger(__name__)

#: The executions whose trace runs in this process now and may carry their result back,
#: with the result kept so far (None: none yet). A pool process runs one trace at a time.
_kept: dict[tuple[str, str], StoredResult | None] = {}
#: This is a pool process of a worker whose requests take carried results (set as it starts).
_enabled = False


def enable() -> None:
    """This process is a prefork pool process: its successes may be carried back."""
    global _enabled
    _enabled = True


def enabled() -> bool:
    return _enabled


class CarriedResult(str):
    """The text of a success's return (what Celery reports of it), with the encoded result
    the settler is to write for the execution ``(job_id, token)``."""

    job_id: str
    token: str
    stored: StoredResult

    def __new__(cls, text: str, job_id: str, token: str, stored: StoredResult) -> CarriedResult:
        carried = super().__new__(cls, text)
        carried.job_id = job_id
        carried.token = token
        carried.stored = stored
        return carried

    def __reduce__(self) -> tuple[Any, ...]:
        return (CarriedResult, (str(self), self.job_id, self.token, self.stored))

    def plain(self) -> str:
        """The text alone, for Celery's own handlers (the task-succeeded event)."""
        return str.__str__(self)


def open_for(job_id: str, token: str) -> None:
    """The trace of this execution starts here, and its return can carry its result."""
    _kept[(job_id, token)] = None


def opened(job_id: str, token: str) -> bool:
    """Whether this execution's trace runs here and its return can carry its result."""
    return (job_id, token) in _kept


def kept(job_id: str, token: str) -> bool:
    """Whether a result of this execution is kept to be carried back."""
    return _kept.get((job_id, token)) is not None


def keep(job_id: str, token: str, stored: StoredResult) -> None:
    """Keep a success's result to carry back with its execution's return (opened here)."""
    _kept[(job_id, token)] = stored


def close(job_id: str, token: str) -> StoredResult | None:
    """The trace ended: the result kept for this execution, if any, to carry or write."""
    return _kept.pop((job_id, token), None)


def write_kept(store: Any) -> None:
    """Write the result kept here now (a keyed send from the task's success handlers: a
    success not written still holds its business key); nothing is carried back then."""
    for key, stored in list(_kept.items()):
        if stored is not None:
            del _kept[key]  # later outcomes of the execution are written, as before
            write(store, key[0], key[1], stored)


def write(store: Any, job_id: str, token: str, stored: StoredResult) -> None:
    """Write a success's result in this process (the job store's ``store_outcome``)."""
    if not store.store_outcome(job_id, token, JobStatus.SUCCEEDED, **stored_values(stored)):
        logger.warning(
            "ratchet: result of job %s not stored: the job is no longer held by this "
            "execution (already finished, or recovered from a node presumed dead)",
            job_id,
        )


def stored_values(stored: StoredResult) -> dict[str, Any]:
    """The row's columns of a stored result."""
    return {
        "job_result": stored.value,
        "result_type": stored.type_name,
        "result_meta": stored.meta,
    }


# A keyed send from a task's success handlers in a pool process writes the kept result first,
# as it was written before those handlers ran when the pool process wrote every result.
BEFORE_KEYED_SEND.append(lambda state: write_kept(state.store))
