"""The seeds' execution type of each job sent (``scheduler_job.job_type``).

Celery's message says most of it: a member of a group, of a chord's header or of a batch
carries its group (BATCH_CHILD); a chain's first step carries the rest of its chain
(CHAIN_STEP; the steps after it are stored ahead as CHAIN_STEP and keep their type when
released, retried or handed over). What the message cannot say — a workflow's branch, a
join, a batch's outcome callback, the dead-letter alert — the code sending it says, for the
jobs its send writes (:func:`sending_as`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from celery_ratchet.domain.job import JobType

_SENDING_AS: ContextVar[JobType | None] = ContextVar("ratchet_sending_as", default=None)


@contextmanager
def sending_as(job_type: JobType) -> Iterator[None]:
    """The jobs sent in this block are of ``job_type`` (its first ones: the steps a chain
    stores ahead are CHAIN_STEP whatever the block says)."""
    token = _SENDING_AS.set(job_type)
    try:
        yield
    finally:
        _SENDING_AS.reset(token)


def job_type_of(headers: dict[str, Any], body: Any) -> JobType:
    """The type of the job a message makes, sent now."""
    given = _SENDING_AS.get()
    if given is not None:
        return given
    if headers.get("group"):
        return JobType.BATCH_CHILD
    embed = body[2] if isinstance(body, (tuple, list)) and len(body) == 3 else None
    if isinstance(embed, dict) and embed.get("chain"):
        return JobType.CHAIN_STEP
    return JobType.SINGLE
