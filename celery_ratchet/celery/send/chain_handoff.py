"""A chain's next step, sent by a task this worker runs in its own process (``-P threads``,
``solo``, ``eventlet``, ``gevent``), is released as claimed by this worker: it starts
without a claim of its own and without waiting for a wake-up. Only while the worker has room
and found no backlog on its last claim, so the step jumps ahead of no waiting job; else, and
in a prefork pool's processes, the step is released for any worker, as before. See
:mod:`celery_ratchet.store.step_handoff`."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

from celery_ratchet.celery.compat import continues_chain_of
from celery_ratchet.celery.send.transactions import joined
from celery_ratchet.domain.job import NewJob
from celery_ratchet.errors import RatchetError

logger = logging.getLogger(__name__)


def handed_to_this_worker(app: Celery, state: Any, job: NewJob, body: Any) -> bool:
    """Release ``job`` (a chain step sent from a running task) as claimed by this worker;
    False, with nothing written, when it is to be sent as usual."""
    runtime = state.runtime
    if runtime is None or job.parent_id is None:
        return False
    current = app.current_worker_task
    if current is None or current.request.id != job.parent_id:
        return False
    embed = body[2] if isinstance(body, (tuple, list)) and len(body) == 3 else None
    chain = embed.get("chain") if isinstance(embed, dict) else None
    if not continues_chain_of(current.request, job.job_id, chain):
        return False
    epoch = runtime.accepts_chain_step(job.queue)
    if epoch is None:
        return False
    with joined(app) as unit:
        if unit is not None:  # written in the task's own transaction: seen at its commit
            return False
    try:
        claimed = state.store.release_step_to(job, runtime.node_id)
    except RatchetError as exc:  # the usual send retries, or says why it cannot
        logger.debug("ratchet: chain step %s not handed over: %s", job.job_id, exc)
        return False
    if claimed is None:
        return False
    if job.group_id:  # the last step of a chain in a group: its group's row, as any send
        try:
            state.batches.open_groups([job.group_id])
        except RatchetError as exc:  # the step is claimed: it runs; only the listing lacks it
            logger.warning("ratchet: group %s not recorded: %s", job.group_id, exc)
    runtime.take_released(claimed, epoch)
    return True
