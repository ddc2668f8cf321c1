"""A claimed job handed to Celery: the task's strategy, as a broker's delivery would be."""

from __future__ import annotations

import logging
import time
from typing import Any

from celery import signals
from celery.exceptions import InvalidTaskError, NotRegistered
from kombu.exceptions import ContentDisallowed, DecodeError

from celery_ratchet.celery.control.events import RECEIVING
from celery_ratchet.celery.execution.job_message import JobMessage
from celery_ratchet.celery.execution.outcomes import report_end
from celery_ratchet.celery.results.backend import exception_record
from celery_ratchet.celery.send.message import runs_code, safe_accept, serializer_name
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import ClaimedJob, JobStatus
from celery_ratchet.domain.unknown_tasks import HandBack, HandTo, UnknownTasks
from celery_ratchet.errors import (
    CompressedPayloadTooLarge,
    MalformedJob,
    RatchetError,
    SerializerNotAllowed,
)
from celery_ratchet.runtime.base import Declined
from celery_ratchet.runtime.worker import WorkerRuntime

logger = logging.getLogger(__name__)

_MALFORMED = (InvalidTaskError, ContentDisallowed, DecodeError, KeyError, TypeError, ValueError)


class Dispatcher:
    """Starts one claimed job in Celery; fails it cleanly when Celery cannot take it."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        # Whatever accept_content says, a row is never decoded with a serializer that can
        # run code unless ratchet_allow_pickle is on: anyone who can write a row could.
        settings = ratchet_state(consumer.app).settings
        self.accept, _ = safe_accept(consumer.app.conf.accept_content, settings.allow_pickle)
        #: A compressed body decompresses to at most a multiple of this (celery/send/inflate.py).
        self.max_payload_kb = settings.max_payload_kb
        self.runtime: WorkerRuntime | None = None
        self.unknown_tasks = UnknownTasks(settings.unknown_task_grace_seconds)
        #: A node whose heartbeat is older than this is not handed jobs.
        self.live_within = settings.node_orphan_grace_seconds

    def __call__(self, job: ClaimedJob) -> None:
        content_type = job.message.content_type
        if content_type not in self.accept and runs_code(content_type):
            self._refused(job, serializer_name(content_type))
            return
        strategy = self.consumer.strategies.get(job.task_name)
        if strategy is None:
            self._unknown(job)
            return
        try:
            message = JobMessage(
                job, accept=self.accept, on_end=self._on_end, max_payload_kb=self.max_payload_kb
            )
        except (MalformedJob, CompressedPayloadTooLarge) as exc:  # a body it cannot inflate
            logger.error("ratchet: job %s failed unrun: %s", job.job_id, exc)
            self._on_end(job, JobStatus.FAILED, exception_record(exc), None)
            return
        receiving = RECEIVING.set(job)  # its task-received event carries its type
        try:
            strategy(message, None, message.ack_log_error, message.reject_log_error, None)
        except _MALFORMED as exc:
            logger.error("ratchet: job %s is malformed and cannot run: %r", job.job_id, exc)
            message.end(
                JobStatus.FAILED,
                error=exception_record(
                    InvalidTaskError(f"malformed job row ({type(exc).__name__}: {exc})")
                ),
            )
        finally:
            RECEIVING.reset(receiving)

    def _on_end(
        self,
        job: ClaimedJob,
        status: JobStatus | None,
        error: str | None,
        traceback: str | None,
        failed: bool | None = None,
    ) -> None:
        """Each job's one end (``JobMessage.end``, or a job Celery never took), to the
        runtime this dispatcher feeds, which is set once it is made."""
        assert self.runtime is not None
        report_end(self.runtime, job, status, error, traceback, failed)

    def _refused(self, job: ClaimedJob, serializer: str) -> None:
        exc = SerializerNotAllowed(serializer)
        logger.error("ratchet: job %s failed unrun: %s", job.job_id, exc)
        self._on_end(job, JobStatus.FAILED, exception_record(exc), None)

    def _knowing(self, job: ClaimedJob, now: float) -> list[str]:
        """The live nodes (other than this one) that said they have the job's task and
        serve its queue; none when they cannot be read now."""
        found = self.unknown_tasks.knowing(job.task_name, job.queue, now)
        if found is not None:
            return found
        excluding = self.runtime.node_id if self.runtime is not None else None
        try:
            found = ratchet_state(self.consumer.app).store.nodes_knowing(
                job.task_name, job.queue, self.live_within, excluding=excluding
            )
        except RatchetError as exc:  # none found: handed back for anyone, as before
            logger.warning("ratchet: the workers that know task %r were not read: %s",
                           job.task_name, exc)  # fmt: skip
            found = []
        self.unknown_tasks.remember(job.task_name, job.queue, found, now)
        return found

    def _unknown(self, job: ClaimedJob) -> None:
        """A task this worker does not know: handed to a live worker that does, if one
        says so; else handed back for workers that do, for a while (a rolling deploy
        brings them), then failed."""
        grace = self.unknown_tasks.grace_seconds
        now = time.monotonic()
        decision = self.unknown_tasks.decide(job.job_id, self._knowing(job, now), now)
        if isinstance(decision, HandTo):
            if self.unknown_tasks.first_handed(job.task_name):
                logger.warning(
                    "ratchet: task %r is unknown to worker %s, and live worker %s has it "
                    "registered: its jobs are handed to the workers that have it",
                    job.task_name,
                    self.consumer.hostname,
                    decision.node,
                )
            raise Declined(0, to_node=decision.node)
        if isinstance(decision, HandBack):
            handed_back_for = decision.seconds
            if self.unknown_tasks.first_of(job.task_name):
                logger.warning(
                    "ratchet: task %r is not registered on worker %s: its jobs are handed "
                    "back for workers that know it (a rolling deploy?), each for up to %ss "
                    "(ratchet_unknown_task_grace_seconds), then fail as NotRegistered",
                    job.task_name,
                    self.consumer.hostname,
                    f"{grace:g}",
                )
            raise Declined(handed_back_for)
        waited = (
            f", and no worker that knows it took it in the {grace:g}s it was handed back for "
            "(ratchet_unknown_task_grace_seconds)"
            if grace
            else ""
        )
        exc = NotRegistered(
            f"task {job.task_name!r} is not registered on worker {self.consumer.hostname}"
            f"{waited}; import its module in the worker (include=, imports=, "
            "autodiscover_tasks) or route it to a queue served by workers that know it, then "
            "retry the job"
        )
        logger.error("ratchet: job %s failed: %s", job.job_id, exc)
        signals.task_unknown.send(
            sender=self.consumer, message=None, exc=exc, name=job.task_name, id=job.job_id
        )
        self._on_end(job, JobStatus.FAILED, exception_record(exc), None)
