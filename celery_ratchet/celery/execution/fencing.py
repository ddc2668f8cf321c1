"""The last check before a claimed job runs, in the process that runs it.

Jobs wait inside the pool (a prefork pool holds up to one more per process) where the node's
buffer checks no longer reach them. If the node's main process was frozen or cut off from the
database long enough to be declared dead, another node may be running those jobs already. So
each task's tracer is wrapped: before the task starts, the node's fence
(:mod:`celery_ratchet.runtime.fence`) must vouch for the claim, else the claim is read from the
database. A claim that is gone means the job is not started (:class:`ClaimGone`); one that
cannot be read is handed back, not started (:class:`ClaimUnconfirmed`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from billiard.einfo import ExceptionInfo
from celery import Celery
from celery.app.trace import TraceInfo, trace_ok_t
from celery.exceptions import Ignore
from celery.states import IGNORED

from celery_ratchet.celery.compat import set_task_tracer, task_tracer
from celery_ratchet.celery.execution.aio import offload
from celery_ratchet.celery.send.message import CLAIM_HEADER, FENCE_HEADER
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import StoreBusy, StoreUnavailable
from celery_ratchet.runtime.fence import current_fence

logger = logging.getLogger(__name__)

_FENCED = "_ratchet_fenced"


class NotStarted(Ignore):
    """A claimed job was not started: this node may not hold it any more."""


class ClaimGone(NotStarted):
    """The claim was taken from this node (declared dead): another node runs the job."""


class ClaimUnconfirmed(NotStarted):
    """The claim could not be read (the store is unreachable): the job is handed back."""


def fence_tracers(app: Celery) -> None:
    """Wrap the tracer of every task of ``app`` in this process with the claim check."""
    for task in app.tasks.values():
        tracer = task_tracer(task)
        if tracer is not None and not getattr(tracer, _FENCED, False):
            set_task_tracer(task, _fenced(app, tracer))


def _fenced(app: Celery, tracer: Callable[..., Any]) -> Callable[..., Any]:
    def trace(uuid: str, args: Any, kwargs: Any, request: Any = None) -> Any:
        try:
            check_claim(app, uuid, request)
        except NotStarted as exc:
            logger.warning("ratchet: job %s not started: %s", uuid, exc)
            return trace_ok_t(ExceptionInfo(internal=True), TraceInfo(IGNORED, exc), 0.0, None)
        return tracer(uuid, args, kwargs, request)

    setattr(trace, _FENCED, True)
    return trace


def check_claim(app: Celery, job_id: str, request: Any) -> None:
    """Raise :class:`NotStarted` unless this execution still holds the job's claim."""
    if not isinstance(request, dict):
        return
    token = request.get(CLAIM_HEADER)
    if token is None:  # not a claimed execution (an eager call, a message from elsewhere)
        return
    if current_fence().vouches(request.get(FENCE_HEADER), time.monotonic()):
        return
    logger.debug("ratchet: job %s: reading its claim before starting it", job_id)
    try:
        held = offload(ratchet_state(app).store.holds, job_id, token)
    except Exception as exc:  # unreachable, busy, or any refusal: never start unconfirmed
        reason = exc if isinstance(exc, (StoreUnavailable, StoreBusy)) else type(exc).__name__
        raise ClaimUnconfirmed(
            f"its claim could not be read ({reason}); handing it back instead of risking a "
            "second run"
        ) from None
    if not held:
        raise ClaimGone(
            "this node lost its claim (it was declared dead while the job waited); another "
            "node runs it"
        )
