"""Where every Celery send is written: :class:`JobBatch` and :func:`write_jobs`.

``.delay``, ``apply_async``, ``send_task``, ``self.retry``, ``replace``, canvas and chord
callbacks all reach ``app.amqp.send_task_message`` (:mod:`celery_ratchet.celery.send.amqp`), which
builds the job and hands it to the "producer" acquired from the pool: a :class:`JobBatch`.
Jobs sent through one are written together, in one statement, when it is released. A group
holds one producer for all its members, so a group of 1,000 is one multi-row insert, and all
or none of it is stored (a group of a generator writes each member as it is sent).

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

from celery import Celery
from kombu.connection import Connection

from celery_ratchet.celery.send.transactions import joined
from celery_ratchet.celery.state import NO_BROKER, ratchet_state
from celery_ratchet.domain.job import NewJob
from celery_ratchet.errors import (
    DuplicateJob,
    InvalidJob,
    PayloadTooLarge,
    StoreUnavailable,
    ValueRefused,
)
from celery_ratchet.store.units import Unit

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

    def __init__(self, app: Celery, *, one_by_one: bool = False, definition: bool = False) -> None:
        self.app = app
        #: The producer of a group of a generator: each job is written as it is added, so
        #: the first run while the generator is still yielding (stock Celery publishes
        #: each at once). See :mod:`celery_ratchet.celery.send.lazy_groups`.
        self.one_by_one = one_by_one
        #: Collects a message that is never sent as such (a recurring job's template): no
        #: publish signal fires for it; each occurrence made from it is the send.
        self.definition = definition
        self.jobs: list[NewJob] = []
        self.waiting: list[NewJob] = []
        self._on_stored: list[Callable[[], None]] = []
        #: The ``after_task_publish`` of the job added last, until the next send begins
        #: (:meth:`begin_send`) or the batch is written.
        self._unannounced: Callable[[], None] | None = None
        #: Results handed out for jobs of this batch, by job id: pointed at the holder of a
        #: taken key.
        self._results: dict[str, list[Any]] = {}
        #: Groups whose row a flush of this batch wrote: a group of a generator is written
        #: member by member, and its row once.
        self._groups_opened: set[str] = set()
        self._connection: _NoBrokerConnection | None = None

    def add(
        self,
        job: NewJob,
        on_stored: Callable[[], None],
        waiting: list[NewJob] | None = None,
        *,
        published: Callable[[], None] | None = None,
    ) -> None:
        """``published``: the job's ``after_task_publish``, sent before the next send's
        ``before_task_publish`` or, for the last job, once the batch is written."""
        self.jobs.append(job)
        self.waiting.extend(waiting or ())
        self._on_stored.append(on_stored)
        self._unannounced = published
        if self.one_by_one:
            self.flush()

    def begin_send(self) -> None:
        """Another send into this batch begins: the one before it is over. Celery pairs
        each ``before_task_publish`` with its ``after_task_publish`` before the next send
        starts, and receivers rely on it: OpenTelemetry's makes its send span current
        between the two, so with every ``after`` held to the end, each member's span would
        be the child of the one before and the last would stay current after the send."""
        announce, self._unannounced = self._unannounced, None
        if announce is not None:
            announce()

    def end_sends(self) -> None:
        """The batch is taken whole by a caller that writes it in its own way: the last
        send's ``after_task_publish`` (the others have had theirs)."""
        self.begin_send()

    def follow(self, result: Any) -> None:
        """``result`` is of a job sent through this batch: if the job's business key turns
        out to be held by an active job, the result is pointed at that job on flush."""
        self._results.setdefault(result.id, []).append(result)

    def take(self) -> tuple[list[NewJob], list[NewJob], list[Callable[[], None]]]:
        """Hand over what was collected (jobs, waiting chain steps, what to call once they
        are stored) to a caller that writes them itself; the batch is empty after."""
        last = [self._unannounced] if self._unannounced is not None else []
        taken = self.jobs, self.waiting, last + self._on_stored
        self.jobs, self.waiting, self._on_stored, self._unannounced = [], [], [], None
        return taken

    def flush(self) -> None:
        jobs, waiting, callbacks = self.take()
        if not jobs:
            _take_chords_opened()  # a write of nothing is no chord's header
            return
        # Results made ahead of their job's send (a lazy group reads one member ahead)
        # wait for the flush that writes it.
        results = [r for j in jobs for r in self._results.pop(j.job_id, ())]
        conf = self.app.conf
        policy = dict(conf.task_publish_retry_policy or {})
        held = write_jobs(
            self.app, jobs, waiting, conf.task_publish_retry, policy, self._groups_opened
        )
        point_at_holders(held, results)
        for stored in callbacks:
            stored()

    def release(self) -> None:
        try:
            self.flush()
        finally:
            self._results = {}
            _open_batches.set(tuple(b for b in _open_batches.get() if b is not self))
            if self._connection is not None:
                self._connection.release()
                self._connection = None

    def __enter__(self) -> JobBatch:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, *_: Any) -> None:
        if exc_type is not None:  # the sending code failed part-way: store none of it
            self.jobs, self._on_stored, self._results = [], [], {}
            self._unannounced = None
            discard_unsent_chords(self.app)
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


def write_jobs(
    app: Celery,
    jobs: list[NewJob],
    waiting: list[NewJob],
    retry: bool,
    policy: dict[str, Any],
    groups_opened: set[str] | None = None,
) -> dict[str, str]:
    """Write ``jobs`` (and the chain steps stored ahead, ``waiting``) where this moment's
    writes go: the caller's transaction, or the store's own connections, retried as
    ``task_publish_retry`` says. Their groups get a row (for `ratchet batches`; a chord's
    exists already); the chords this context opened, whose header this is, go if the store
    refuses it; workers of their queues are told (at commit). Returns the jobs whose
    business key another job holds, mapped to the holders. ``groups_opened``: the groups
    whose row an earlier write of the same batch made, left out; those written are added."""
    state = ratchet_state(app)
    chords = _take_chords_opened()
    known = groups_opened if groups_opened is not None else set()
    groups = list(dict.fromkeys(j.group_id for j in jobs if j.group_id and j.group_id not in known))
    with joined(app) as within:
        if groups:
            state.batches.open_groups(groups, within)
            known.update(groups)
        if within is not None:
            with _discarded_if_refused(state, chords, within):
                held = state.store.enqueue_within(within, jobs, waiting)
            queues = [j.queue for j in jobs if j.job_id not in held]
            if queues:
                _wake_after_commit(within, state, queues)
            return held
    if any(j.business_key is not None for j in jobs):
        # Not inside a caller's transaction: what it locked (SQLite: the whole database)
        # could keep the settler from writing while this waits.
        _after_own_results(state)
    with _discarded_if_refused(state, chords, None):
        held = with_publish_retry(
            lambda again: state.store.enqueue_many(jobs, waiting, maybe_committed=again),
            retry,
            policy,
        )
    queues = [j.queue for j in jobs if j.job_id not in held]
    if queues:
        state.published(queues)
    return held


#: How long a keyed send in a worker waits for the results its settler has not written.
OWN_RESULTS_WAIT_SECONDS = 10.0


def _after_own_results(state: Any) -> None:
    """A keyed send in the worker's own process waits until the results handed to its
    settler are written: a success not committed yet still holds its business key, and a
    send of that key from the task's success handlers would be taken for its duplicate."""
    runtime = state.runtime
    if runtime is None or not runtime.keeps_outcomes_here():
        return
    if not runtime.wait_results_written(OWN_RESULTS_WAIT_SECONDS):
        logger.warning(
            "ratchet: results of this worker not written after %.0f s (the job store is "
            "slow or unreachable); a keyed send goes on, and a key its own task held is "
            "taken for a duplicate",
            OWN_RESULTS_WAIT_SECONDS,
        )


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


def _discard(state: Any, batch_ids: Sequence[str], unit: Unit | None) -> None:
    try:
        state.batches.discard_unsent(batch_ids, unit)
    except Exception as exc:  # the send's own error is the one to raise
        logger.warning("ratchet: batches %s left open: %s", ", ".join(batch_ids), exc)


@contextlib.contextmanager
def _discarded_if_refused(state: Any, opened: Sequence[str], unit: Unit | None) -> Iterator[None]:
    """Jobs are being written; ``opened``: the chords whose header they are, whose rows
    this very context made. If the store refuses the jobs, those rows go too, rather than
    stay open for ever. A chord another send made (one whose body or later step is being
    sent) is never among them."""
    try:
        yield
    except _REFUSALS:
        if opened:
            _discard(state, opened, unit)
        raise


def discard_unsent_chords(app: Celery) -> None:
    """The sending code failed before its jobs were written (a payload too large, a held
    key, a member whose arguments Celery's check refused): the chords whose header it was
    sending go. A write takes the chords it is the header of as it starts, so a chord
    still noted here has no member written."""
    opened = _take_chords_opened()
    if opened:
        with joined(app) as within:
            _discard(ratchet_state(app), opened, within)


def _wake_after_commit(unit: Unit, state: Any, queues: list[str]) -> None:
    """Jobs written in Django's transaction wake workers over Redis once it commits (with
    ``ratchet_events_url``); PostgreSQL's NOTIFY needs nothing: it rides the transaction."""
    after_commit = unit.after_commit
    if after_commit is not None and state.settings.events_url:
        after_commit(lambda: state.published(queues))


def with_publish_retry(action: Callable[[bool], T], retry: bool, policy: dict[str, Any]) -> T:
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


#: Where a send outside a caller's batch leaves the holders of taken business keys.
_held: ContextVar[dict[str, str] | None] = ContextVar("ratchet_held_keys", default=None)


def point_at_holders(held: dict[str, str], results: list[Any]) -> None:
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
        _reckon_on_database_clock(app, args, kwargs)
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
    # Known by identity (a caller's functools.wraps wrapper copies the mark), with what it
    # wraps: see compat.sends_as_celery.
    app.ratchet_send_task = (send_following_held_keys, send_task)


def _reckon_on_database_clock(app: Celery, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A countdown (and an ``expires`` in seconds) counts from the database's time, not
    this node's: Celery adds it to ``now``, which it takes from the node's clock unless
    given. An absolute ``eta=`` is the sender's to choose, and stays as given."""
    if kwargs.get("now") is not None:
        return
    countdown = args[3] if len(args) > 3 else kwargs.get("countdown")
    expires = kwargs.get("expires")
    relative_expiry = isinstance(expires, (int, float)) and not isinstance(expires, bool)
    if countdown or relative_expiry:
        kwargs["now"] = ratchet_state(app).clock.now()


@contextmanager
def bulk(app: Celery) -> Iterator[JobBatch]:
    """Send many tasks as one insert: ``with bulk(app) as p: t.apply_async(..., producer=p)``."""
    with app.producer_or_acquire() as producer:
        yield producer
