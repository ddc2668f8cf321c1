"""The app's ``amqp``: Celery's message building, with a send that writes a job row (or, for a
retry of the job that is running, reschedules its own row) instead of publishing."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from celery import Celery, signals
from celery.app.amqp import AMQP
from kombu.common import Broadcast
from kombu.connection import Connection

from celery_ratchet.celery.canvas.batches import PROGRESS_ENDED_TASK, progress_ended
from celery_ratchet.celery.compat import cache_producer_pool, cached_producer_pool
from celery_ratchet.celery.control.events import send_task_sent, type_fields
from celery_ratchet.celery.send import alike_groups
from celery_ratchet.celery.send import options as options_
from celery_ratchet.celery.send.chain_handoff import handed_to_this_worker
from celery_ratchet.celery.send.current_job import claim_of_current_job
from celery_ratchet.celery.send.job_types import job_type_of
from celery_ratchet.celery.send.message import (
    CLAIM_HEADER,
    check_protocol,
    check_result_backend,
    job_from_message,
    waiting_steps,
)
from celery_ratchet.celery.send.sender import (
    JobBatch,
    JobBatchPool,
    point_at_holders,
    with_publish_retry,
    write_jobs,
)
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import NewJob
from celery_ratchet.errors import (
    DuplicateJob,
    UnsupportedRouting,
)

logger = logging.getLogger(__name__)


class RatchetAMQP(AMQP):
    @property
    def producer_pool(self) -> JobBatchPool:
        pool: JobBatchPool | None = cached_producer_pool(self)
        if pool is None:
            pool = JobBatchPool(self.app)
            cache_producer_pool(self, pool)
        return pool

    publisher_pool = producer_pool

    def Connection(self, *args: Any, **kwargs: Any) -> Connection:
        """The app's stand-in broker connection; it knows its app, so that purging one of
        its queues (``celery purge``) deletes that queue's pending jobs in the store."""
        connection = Connection(*args, **kwargs)
        connection.ratchet_app = self.app  # type: ignore[attr-defined]
        return connection

    def _create_task_sender(self) -> Any:
        """Celery's (``compat.AMQP_CREATE_TASK_SENDER_METHOD``), its options read the same
        way, with a send that writes the job to the store instead of publishing it."""
        app = self.app
        amqp = self
        conf = app.conf
        default_serializer = conf.task_serializer
        default_compressor = conf.task_compression
        default_retry = conf.task_publish_retry
        default_policy = conf.task_publish_retry_policy
        send_before_publish = signals.before_task_publish.send
        send_after_publish = signals.after_task_publish.send

        def send_task_message(
            producer: Any,
            name: str,
            message: Any,
            exchange: Any = None,
            routing_key: str | None = None,
            queue: Any = None,
            event_dispatcher: Any = None,
            retry: bool | None = None,
            retry_policy: dict[str, Any] | None = None,
            serializer: str | None = None,
            delivery_mode: Any = None,
            compression: str | None = None,
            declare: Any = None,
            headers: dict[str, Any] | None = None,
            exchange_type: str | None = None,
            timeout: float | None = None,
            confirm_timeout: float | None = None,
            **kwargs: Any,
        ) -> None:
            if name == PROGRESS_ENDED_TASK:
                # A batch's progress report ended (its link): the batch releases the next
                # report here and now; the link itself is never a job.
                progress_ended(app, **message[2][1])
                return
            alike_groups.offer(name, message, {
                "exchange": exchange, "routing_key": routing_key, "queue": queue,
                "event_dispatcher": event_dispatcher, "retry": retry,
                "retry_policy": retry_policy, "serializer": serializer,
                "delivery_mode": delivery_mode, "compression": compression, "declare": declare,
                "headers": headers, "exchange_type": exchange_type, "timeout": timeout,
                "confirm_timeout": confirm_timeout, **kwargs,
            })  # fmt: skip
            headers2, properties, body, sent_event = message
            if type(body) is not tuple:  # protocol 1's body is a dict: set after configuring
                check_protocol(app.conf.task_protocol)
            check_result_backend(app.conf.result_backend)
            if headers:
                headers2.update(headers)
            kwargs.pop("now", None)  # what countdowns count from (see sender), not a property
            given = kwargs.pop("ratchet", None)
            if given is None:  # a retry or a replace: the options of the job it copies
                given = headers2.get(options_.HEADER)
            if kwargs:
                properties.update(kwargs)
            qname = _queue_name(amqp, queue, exchange, routing_key)
            policy = dict(default_policy, **(retry_policy or {}))
            batch = producer if isinstance(producer, JobBatch) else None
            if batch is not None:
                batch.begin_send()
            signalled = batch is None or not batch.definition
            if signalled:
                send_before_publish(
                    sender=name,
                    body=body,
                    exchange=exchange,
                    routing_key=routing_key,
                    declare=declare,
                    headers=headers2,
                    properties=properties,
                    retry_policy=policy,
                )
            state = ratchet_state(app)
            settings = state.settings
            options = options_.resolve(name, app.tasks.get(name), given, settings)
            options_.apply_to_message(options, headers2, properties)
            # signature_from_request (retries, retry_on_worker_lost) carries the claim header of
            # the request it copies; a replace() is found as the job running in this process.
            claim = headers2.get(CLAIM_HEADER) or claim_of_current_job(app, headers2.get("id"))
            job = job_from_message(
                resource=options.get("resource"),
                business_key=options.get("business_key"),
                on_duplicate=options.get("on_duplicate"),
                tags=options.get("tags", ()),
                headers=headers2,
                properties=properties,
                body=body,
                queue=qname,
                serializer=serializer or default_serializer,
                compression=compression or default_compressor,
                default_priority=settings.default_priority,
                max_payload_kb=settings.max_payload_kb,
                allow_pickle=settings.allow_pickle,
                timezone_=app.timezone,
                job_type=job_type_of(headers2, body),
            )
            retries = default_retry if retry is None else retry

            def signal_published() -> None:
                if signalled:
                    send_after_publish(
                        sender=name, body=body, headers=headers2,
                        exchange=exchange, routing_key=routing_key,
                    )  # fmt: skip

            def announced() -> None:
                if sent_event:
                    send_task_sent(app, {
                        **sent_event, "queue": qname, "routing_key": routing_key,
                        **type_fields(job.job_type),
                    })  # fmt: skip

            def published() -> None:
                signal_published()
                announced()

            if claim is not None:
                # A retry or a replace of the running job: the same row, rescheduled.
                with_publish_retry(
                    lambda again: _reschedule(state.store, claim, job, again), retries, policy
                )
                state.published([job.queue])
                published()
                return
            if _own_batch(producer) and handed_to_this_worker(app, state, job, body):
                published()
                return
            waiting = _taking_over_this_job(app, waiting_steps(job, body))
            if batch is not None:
                batch.add(job, announced, waiting, published=signal_published)
                return
            held = write_jobs(app, [job], waiting, retries, policy)
            point_at_holders(held, [])
            published()

        self.ratchet_sender = send_task_message  # known by identity: see alike_groups
        return send_task_message


def _own_batch(producer: Any) -> bool:
    """Whether ``producer`` is the batch ``send_task`` acquired for this send alone (the
    tracer sends a chain's next step so), rather than one the caller fills (``bulk()``)."""
    return not isinstance(producer, JobBatch) or not (producer.jobs or producer.one_by_one)


def _queue_name(amqp: AMQP, queue: Any, exchange: Any, routing_key: str | None) -> str:
    if queue is None and exchange is None:
        queue = amqp.default_queue
    if isinstance(queue, str):
        queue = amqp.queues[queue]
    if isinstance(queue, Broadcast):
        raise UnsupportedRouting(
            f"broadcast queue {queue.name!r}: a job row is claimed by exactly one worker; "
            "send one task per target instead"
        )
    if queue is not None:
        return str(queue.name)
    if routing_key:
        return routing_key
    return str(amqp.default_queue.name)


def _taking_over_this_job(app: Celery, steps: list[NewJob]) -> list[NewJob]:
    """The chain steps stored ahead, the one whose id is the job this process runs now (a
    task replaced by a chain: its last step takes the task's id) marked to take its row
    over in the same write; the task's row would otherwise still be RUNNING, its id taken,
    when the chain's first step ends and sends that step."""
    for index, step in enumerate(steps):
        token = claim_of_current_job(app, step.job_id)
        if token is not None:
            return [
                *steps[:index],
                dataclasses.replace(step, takes_over=token),
                *steps[index + 1 :],
            ]
    return steps


def _reschedule(store: Any, token: str, job: NewJob, maybe_committed: bool) -> None:
    if store.replace_running(token, job):
        return
    # Not (or no longer) the row this claim holds: a new id sent from a request's copy, a
    # claim taken over by orphan recovery, in which case the row's new owner decides, or an
    # earlier try that rescheduled the row and lost its reply (then the row is ours).
    try:
        store.enqueue(job, maybe_committed=maybe_committed)
    except DuplicateJob:
        logger.warning(
            "ratchet: job %s was not rescheduled: its claim was taken over (the node was "
            "presumed dead); the execution that now owns it decides its fate",
            job.job_id,
        )
