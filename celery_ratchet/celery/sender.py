"""Where every Celery send ends: ``app.amqp.send_task_message`` writes a job row instead.

``.delay``, ``apply_async``, ``send_task``, ``self.retry``, ``replace``, canvas and chord
callbacks all pass through here with routing, ids, eta and links already resolved.

A "producer" acquired from the pool is a :class:`JobBatch`: jobs sent through it are written
together, in one statement, when it is released. A group holds one producer for all its
members, so a group of 1,000 is one multi-row insert, and all or none of it is stored.

A send whose business key an active job holds creates nothing: its ``AsyncResult`` is made
to point at the holder (``app.send_task`` is wrapped for that, see :func:`follow_held_keys`);
the results of a group's or ``bulk()``'s members are pointed so when the batch is written.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from celery import Celery, signals
from celery.app.amqp import AMQP
from kombu.common import Broadcast
from kombu.connection import Connection

from celery_ratchet.celery import options as options_
from celery_ratchet.celery.compat import cache_producer_pool, cached_producer_pool
from celery_ratchet.celery.django_db import (
    AFTER_COMMIT,
    django_transaction_of,
    is_django_connection,
    within_django,
)
from celery_ratchet.celery.events import send_task_sent
from celery_ratchet.celery.message import CLAIM_HEADER, job_from_message, waiting_steps
from celery_ratchet.celery.state import NO_BROKER, ratchet_state
from celery_ratchet.domain.job import NewJob
from celery_ratchet.errors import (
    DuplicateJob,
    InvalidJob,
    PayloadTooLarge,
    StoreUnavailable,
    UnsupportedRouting,
    ValueRefused,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")


class _NoTransport:
    driver_type = "ratchet"


class _NoConnection:
    transport = _NoTransport()


class _NoConnections:
    connection = _NoConnection()


class _NoBrokerConnection:
    """What ``send_task`` and Celery's event dispatcher ask of a producer's connection.

    ``send_task`` only wraps the send in ``_reraise_as_library_errors`` (``compat.
    CONNECTION_RERAISE_METHOD``); anything else (custom task events) gets a connection to
    the in-process transport, made on first use.
    """

    def __init__(self) -> None:
        self._real: Connection | None = None

    @contextmanager
    def _reraise_as_library_errors(self, *args: Any, **kwargs: Any) -> Iterator[None]:
        yield

    def __getattr__(self, name: str) -> Any:
        if self._real is None:
            self._real = Connection(NO_BROKER)
        return getattr(self._real, name)

    def release(self) -> None:
        if self._real is not None:
            self._real.release()


class JobBatch:
    """Stands where Celery expects a kombu producer; collects jobs until released."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.jobs: list[NewJob] = []
        self.waiting: list[NewJob] = []
        self._on_stored: list[Callable[[], None]] = []
        #: Results handed out for jobs of this batch: pointed at the holder of a taken key.
        self._results: list[Any] = []
        self._connection: _NoBrokerConnection | None = None

    def add(
        self, job: NewJob, on_stored: Callable[[], None], waiting: list[NewJob] | None = None
    ) -> None:
        self.jobs.append(job)
        self.waiting.extend(waiting or ())
        self._on_stored.append(on_stored)
        if _one_by_one.get():
            self.flush()

    def follow(self, result: Any) -> None:
        """``result`` is of a job sent through this batch: if the job's business key turns
        out to be held by an active job, the result is pointed at that job on flush."""
        self._results.append(result)

    def take(self) -> tuple[list[NewJob], list[NewJob], list[Callable[[], None]]]:
        """Hand over what was collected (jobs, waiting chain steps, what to call once they
        are stored) to a caller that writes them itself; the batch is empty after."""
        taken = self.jobs, self.waiting, self._on_stored
        self.jobs, self.waiting, self._on_stored = [], [], []
        return taken

    def flush(self) -> None:
        jobs, waiting, callbacks = self.take()
        if not jobs:
            _take_chords_opened()  # a write of nothing is no chord's header
            return
        written = {j.job_id for j in jobs}
        # Results made ahead of their job's send (a lazy group reads one member ahead)
        # wait for the flush that writes it.
        results = [r for r in self._results if r.id in written]
        self._results = [r for r in self._results if r.id not in written]
        conf = self.app.conf
        policy = dict(conf.task_publish_retry_policy or {})
        held = write_jobs(self.app, jobs, waiting, conf.task_publish_retry, policy)
        _point_at_holders(held, results)
        for stored in callbacks:
            stored()

    def release(self) -> None:
        try:
            self.flush()
        finally:
            self._results = []
            _open_batches.set(tuple(b for b in _open_batches.get() if b is not self))
            if self._connection is not None:
                self._connection.release()
                self._connection = None

    def __enter__(self) -> JobBatch:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, *_: Any) -> None:
        if exc_type is not None:  # the sending code failed part-way: store none of it
            self.jobs, self._on_stored, self._results = [], [], []
            discard_refused_chords(self.app, exc)
        self.release()

    @property
    def connection(self) -> _NoBrokerConnection:
        if self._connection is None:
            self._connection = _NoBrokerConnection()
        return self._connection

    @property
    def channel(self) -> Any:
        return self.connection.default_channel

    def publish(self, *args: Any, **kwargs: Any) -> None:
        """Broadcasts (remote control, events) have no broker to go to; they go nowhere."""


#: Set while a group whose members come from a generator is sent: each member is written as
#: it is sent, so the first run while the generator is still yielding (stock Celery publishes
#: each at once), instead of all together when the group's producer is released.
_one_by_one: ContextVar[bool] = ContextVar("ratchet_one_by_one", default=False)


@contextmanager
def sent_one_by_one() -> Iterator[None]:
    """Within: every job sent through a batch is written at once, on its own."""
    token = _one_by_one.set(True)
    try:
        yield
    finally:
        _one_by_one.reset(token)


#: Batches acquired from the pool and not yet released, innermost last: a group's members'
#: results are made (frozen) while its batch is open, before their jobs are written.
_open_batches: ContextVar[tuple[JobBatch, ...]] = ContextVar("ratchet_open_batches", default=())


def follow_in_open_batch(result: Any) -> None:
    """A result made while a batch is open may be of one of its jobs: see JobBatch.follow."""
    batches = _open_batches.get()
    if batches:
        batches[-1].follow(result)


class JobBatchPool:
    """The producer pool of a ratchet app: every acquire yields a fresh :class:`JobBatch`."""

    connections = _NoConnections()
    limit = None

    def __init__(self, app: Celery) -> None:
        self.app = app

    def acquire(self, block: bool = True, timeout: float | None = None) -> JobBatch:
        batch = JobBatch(self.app)
        _open_batches.set((*_open_batches.get(), batch))
        return batch

    def release(self, batch: JobBatch) -> None:
        batch.release()

    def force_close_all(self) -> None:
        pass


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
            headers2, properties, body, sent_event = message
            if headers:
                headers2.update(headers)
            given = kwargs.pop("ratchet", None)
            if given is None:  # a retry or a replace: the options of the job it copies
                given = headers2.get(options_.HEADER)
            if kwargs:
                properties.update(kwargs)
            qname = _queue_name(amqp, queue, exchange, routing_key)
            policy = dict(default_policy, **(retry_policy or {}))
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
            claim = headers2.get(CLAIM_HEADER) or _claim_of_current_job(app, headers2.get("id"))
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
            )
            retries = default_retry if retry is None else retry

            def published() -> None:
                send_after_publish(
                    sender=name, body=body, headers=headers2,
                    exchange=exchange, routing_key=routing_key,
                )  # fmt: skip
                if sent_event:
                    send_task_sent(app, {**sent_event, "queue": qname, "routing_key": routing_key})

            if claim is not None:
                # A retry or a replace of the running job: the same row, rescheduled.
                _with_retry(
                    lambda again: _reschedule(state.store, claim, job, again), retries, policy
                )
                state.published([job.queue])
                published()
                return
            waiting = waiting_steps(job, body)
            if isinstance(producer, JobBatch):
                producer.add(job, published, waiting)
                return
            held = write_jobs(app, [job], waiting, retries, policy)
            _point_at_holders(held, [])
            published()

        return send_task_message


def write_jobs(
    app: Celery, jobs: list[NewJob], waiting: list[NewJob], retry: bool, policy: dict[str, Any]
) -> dict[str, str]:
    """Write ``jobs`` (and the chain steps stored ahead, ``waiting``) where this moment's
    writes go: the caller's transaction, or the store's own connections, retried as
    ``task_publish_retry`` says. Their groups get a row (for `ratchet batches`; a chord's
    exists already); the chords this context opened, whose header this is, go if the store
    refuses it; workers of their queues are told (at commit). Returns the jobs whose
    business key another job holds, mapped to the holders."""
    state = ratchet_state(app)
    chords = _take_chords_opened()
    groups = [j.group_id for j in jobs if j.group_id]
    with joined(app) as within:
        if groups:
            state.batches.open_groups(groups, within)
        if within is not None:
            with _discarded_if_refused(state, chords, within):
                held = state.store.enqueue_within(within, jobs, waiting)
            queues = [j.queue for j in jobs if j.job_id not in held]
            if queues:
                _wake_after_commit(within, state, queues)
            return held
    with _discarded_if_refused(state, chords, None):
        held = _with_retry(
            lambda again: state.store.enqueue_many(jobs, waiting, maybe_committed=again),
            retry,
            policy,
        )
    queues = [j.queue for j in jobs if j.job_id not in held]
    if queues:
        state.published(queues)
    return held


#: Chords whose batch row this context has just created (Celery's ``apply_chord``): the
#: next write of jobs in this context is their header's, and takes them over.
_chords_opened: ContextVar[frozenset[str]] = ContextVar(
    "ratchet_chords_opened", default=frozenset()
)


def note_chord_opened(chord_id: str) -> None:
    """This context has just created the batch row of chord ``chord_id``; its header is
    written next."""
    _chords_opened.set(_chords_opened.get() | {chord_id})


def _take_chords_opened() -> list[str]:
    """The chords whose header the write about to happen is: taken, so that no later write
    of this context can be mistaken for their header."""
    opened = sorted(_chords_opened.get())
    if opened:
        _chords_opened.set(frozenset())
    return opened


#: Errors of a send that wrote nothing: the store refused it before or while writing, in a
#: transaction that rolled back. An outage is not one of them (the write may have committed).
_REFUSALS = (DuplicateJob, InvalidJob, PayloadTooLarge, ValueRefused)


def _discard(state: Any, batch_ids: Sequence[str], conn: Any) -> None:
    try:
        state.batches.discard_unsent(batch_ids, conn)
    except Exception as exc:  # the send's own error is the one to raise
        logger.warning("ratchet: batches %s left open: %s", ", ".join(batch_ids), exc)


@contextlib.contextmanager
def _discarded_if_refused(state: Any, opened: Sequence[str], conn: Any) -> Iterator[None]:
    """Jobs are being written; ``opened``: the chords whose header they are, whose rows
    this very context made. If the store refuses the jobs, those rows go too, rather than
    stay open for ever. A chord another send made (one whose body or later step is being
    sent) is never among them."""
    try:
        yield
    except _REFUSALS:
        if opened:
            _discard(state, opened, conn)
        raise


def discard_refused_chords(app: Celery, exc: BaseException | None) -> None:
    """The sending code failed before its jobs were written (a payload too large, a held
    key): the chords whose header it was sending go, when it was refused."""
    opened = _take_chords_opened()
    if opened and isinstance(exc, _REFUSALS):
        with joined(app) as within:
            _discard(ratchet_state(app), opened, within)


def _wake_after_commit(conn: Any, state: Any, queues: list[str]) -> None:
    """Jobs written in Django's transaction wake workers over Redis once it commits (with
    ``ratchet_events_url``); PostgreSQL's NOTIFY needs nothing: it rides the transaction."""
    after_commit = getattr(conn, "info", {}).get(AFTER_COMMIT)
    if after_commit is not None and state.settings.events_url:
        after_commit(lambda: state.published(queues))


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


def _claim_of_current_job(app: Celery, task_id: str | None) -> str | None:
    """The claim token when ``task_id`` is the job this process is running right now."""
    current = app.current_worker_task
    if current is None or task_id is None:
        return None
    request = current.request
    if request.id != task_id:
        return None
    token = getattr(request, CLAIM_HEADER, None)
    if token is None and isinstance(request.headers, dict):
        token = request.headers.get(CLAIM_HEADER)
    return token


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


def _with_retry(action: Callable[[bool], T], retry: bool, policy: dict[str, Any]) -> T:
    """Run ``action``; on :class:`StoreUnavailable` retry as ``task_publish_retry_policy``
    says (max_retries, interval_start, interval_step, interval_max), then raise.

    ``action`` is told whether an earlier try failed: that try may have committed and lost
    only its reply, so finding its own rows is success, not a duplicate."""
    if not retry:
        return action(False)
    max_retries = policy.get("max_retries", 3)
    interval = float(policy.get("interval_start", 0))
    step = float(policy.get("interval_step", 0.2))
    cap = float(policy.get("interval_max", 0.2))
    attempt = 0
    while True:
        try:
            return action(attempt > 0)
        except StoreUnavailable:
            if max_retries is not None and attempt >= max_retries:
                raise
            attempt += 1
            time.sleep(min(interval, cap))
            interval += step


_within: ContextVar[Any] = ContextVar("ratchet_transaction", default=None)
#: Where a send outside a caller's batch leaves the holders of taken business keys.
_held: ContextVar[dict[str, str] | None] = ContextVar("ratchet_held_keys", default=None)


def _point_at_holders(held: dict[str, str], results: list[Any]) -> None:
    if not held:
        return
    for result in results:
        holder = held.get(result.id)
        if holder is not None:
            result.id = holder
    sink = _held.get()
    if sink is not None:
        sink.update(held)


def follow_held_keys(app: Celery) -> None:
    """Make ``app.send_task`` (which ``apply_async`` and ``delay`` call) return the result of
    the active job holding the business key, when the send created no job for that reason.
    Celery builds the result from the id it chose before the send; only after the write is
    it known whether that id exists."""
    send_task = app.send_task
    if getattr(send_task, "_ratchet", False):
        return

    def send_following_held_keys(*args: Any, **kwargs: Any) -> Any:
        producer = kwargs.get("producer")
        if isinstance(producer, JobBatch):  # written later: pointed when the batch is
            result = send_task(*args, **kwargs)
            producer.follow(result)
            return result
        held: dict[str, str] = {}
        token = _held.set(held)
        try:
            result = send_task(*args, **kwargs)
        finally:
            _held.reset(token)
        holder = held.get(result.id) if held else None
        if holder is not None:
            result.id = holder
        return result

    send_following_held_keys._ratchet = True  # type: ignore[attr-defined]
    app.send_task = send_following_held_keys


def current_transaction() -> Any:
    """The caller's connection inside ``celery_ratchet.transaction()``, else ``None``."""
    return _within.get()


@contextmanager
def joined(app: Celery) -> Iterator[Any]:
    """The connection whose transaction the writes of this moment join, or ``None`` (the
    store's own connections, committed at once): the caller's inside
    ``celery_ratchet.transaction()``; else, when ``ratchet_django_connection`` names a Django
    database, Django's connection while a transaction is open on it."""
    explicit = _within.get()
    if explicit is not None:
        yield explicit
        return
    state = ratchet_state(app)
    alias = state.settings.django_connection
    if alias is None:
        yield None
        return
    with django_transaction_of(alias, state.store) as lent:
        if lent is None:
            yield None
            return
        token = _within.set(lent)
        try:
            yield lent
        finally:
            _within.reset(token)


@contextmanager
def transaction(connection_or_session: Any) -> Iterator[None]:
    """Write the jobs sent in this block in the caller's own database transaction::

        with engine.begin() as conn:                 # or a Session
            conn.execute(orders.insert(), order)
            with celery_ratchet.transaction(conn):
                ship.delay(order["id"])

    The job rows exist if and only if that transaction commits, so a worker never sees a
    job whose data is not there yet (or never will be). The connection must reach the job
    store's database. Under Django, give ``django.db.connection`` (or ``connections[alias]``)
    inside ``transaction.atomic()``: the jobs are written in Django's transaction. On
    PostgreSQL the wake-up notification is delivered at the commit (under Django, the Redis
    one of ``ratchet_events_url`` too); otherwise workers find the jobs by polling.
    """
    target = connection_or_session
    if is_django_connection(target):
        with within_django(target) as lent:
            token = _within.set(lent)
            try:
                yield
            finally:
                _within.reset(token)
        return
    if not hasattr(target, "dialect"):  # a Session: the connection of its transaction
        target = target.connection()
    token = _within.set(target)
    try:
        yield
    finally:
        _within.reset(token)


@contextmanager
def bulk(app: Celery) -> Iterator[JobBatch]:
    """Send many tasks as one insert: ``with bulk(app) as p: t.apply_async(..., producer=p)``."""
    with app.producer_or_acquire() as producer:
        yield producer
