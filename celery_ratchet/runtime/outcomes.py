"""Outcomes of the jobs a node ran: queued, written in batches by the settler thread."""

from __future__ import annotations

import logging
import queue
from dataclasses import replace

from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    Settlement,
    error_record,
)
from celery_ratchet.errors import StoreBusy, StoreUnavailable
from celery_ratchet.runtime.base import (
    _CLOSED,
    _SETTLE_BATCH,
    Intake,
    NodeEvents,
    Throttle,
)
from celery_ratchet.runtime.channel import Channel
from celery_ratchet.runtime.clock import Clock
from celery_ratchet.runtime.holdings import Holdings
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.ports import QueueStore

logger = logging.getLogger(__name__)

#: How long the settler waits on a job row another transaction keeps locked before it
#: writes the node's other outcomes without that row's (MySQL/MariaDB: one second, the
#: least they count).
SETTLE_LOCK_WAIT_SECONDS = 0.2
#: Outcomes held back by such a lock are tried again after this long, then after pauses
#: twice as long, up to the most: each try waits on the locks that are still there.
LOCKED_OUTCOME_RETRY_SECONDS = 1.0
LOCKED_OUTCOME_RETRY_MAX_SECONDS = 16.0
#: Rows written one at a time that all wait on locks, this many: the rest wait for the next try.
_LOCKED_BEFORE_GIVING_UP = 3
#: While other jobs of the node are still running, the settler lets their outcomes gather
#: this long before it writes: a drain's batches then hold more outcomes, and PostgreSQL
#: spends about a fifth less cpu a job on them. A lone job's outcome (nothing else running)
#: is written at once, and so is a result whose slot waits for its write.
SETTLE_GATHER_SECONDS = 0.002


class Settler:
    """Owns the settler thread and the queue of outcomes to write; the public methods are
    thread-safe and never block on the database."""

    def __init__(
        self,
        store: QueueStore,
        settings: RatchetSettings,
        *,
        holdings: Holdings,
        events: NodeEvents,
        intake: Intake,
        channel: Channel,
        clock: Clock,
        throttle: Throttle,
    ) -> None:
        self.store = store
        self.settings = settings
        self._holdings = holdings
        self._events = events
        self._intake = intake
        self._channel = channel
        self._clock = clock
        self._throttle = throttle
        self._settlements: queue.Queue[Settlement] = queue.Queue()
        #: When a write of outcomes last failed (the store unreachable or busy); written by
        #: the settler thread, read by the one that closes the node.
        self.write_failed_at = 0.0

    def settle(self, settlement: Settlement) -> None:
        """Record the end of one dispatched job."""
        settlement = self._holdings.with_permit(settlement)
        # Reported before it is freed: at every instant the job is in flight or unwritten,
        # so the claim check never takes it for a claim this node lost.
        self.report(settlement)
        self.free(settlement.job_id, settlement.token)

    def report_result(self, settlement: Settlement) -> None:
        """Record a success with its result, written with the next batch. Its slot stays
        taken until both the end of the execution was reported (:meth:`release`) and the
        result is written: while the store cannot take outcomes, the node starts nothing
        more, as when each thread waited for its own write."""
        self.report(self._holdings.with_permit(settlement))

    def report(self, settlement: Settlement) -> None:
        """Queue an outcome for the settler to write."""
        self._holdings.reported(settlement)
        self._settlements.put(settlement)

    def hand_back(self, job: ClaimedJob) -> None:
        """A claimed job that will not start here: back to PENDING."""
        self.report(Settlement(job.job_id, job.token, JobStatus.PENDING, resource=job.resource))

    def release(self, job_id: str, token: str, *, due_again: bool = True) -> None:
        """Free the slot of a job whose row needs no write. ``due_again``: the row may be
        due again (a retry rescheduled it): claim at once rather than at the next idle
        look. Else (a success whose result the backend stored) nothing of it is due; work
        it released (a chain's next step) is announced where a channel tells this node,
        and only polling needs the claim."""
        if not self._holdings.free_when_written(job_id, token):
            self.free(job_id, token)
        if due_again or not self._channel.told():
            self._events.hint.set()

    def free(self, job_id: str, token: str) -> None:
        self._holdings.free(job_id, token)
        self._events.woken.set()

    def close(self) -> None:
        """Wake the settler now: it returns once nothing is left to write."""
        self._settlements.put(_CLOSED)

    def _written(self, settlements: list[Settlement]) -> None:
        for job_id, token in self._holdings.written(settlements):
            self.free(job_id, token)
        if any(s.status is JobStatus.PENDING for s in settlements):
            # Handed back, due again at once: this node may claim them (claims it had lost
            # track of), others are told where the channel does not tell them by itself.
            self._channel.announce(self._intake.queues)
            self._events.wake()

    def run(self) -> None:
        """The settler thread: writes the outcomes queued, in batches, until closed."""
        pending: list[Settlement] = []
        # Outcomes whose rows another transaction kept locked: tried again on their own now
        # and then, so that they never hold back the outcomes reported after them.
        locked: list[Settlement] = []
        locked_again = 0.0
        locked_pause = LOCKED_OUTCOME_RETRY_SECONDS
        while True:
            if locked and self._clock.monotonic() >= locked_again:
                locked, reachable = self._write_each(locked)
                if not reachable:
                    self.write_failed_at = self._clock.monotonic()
                # Each try waits on the locks a moment: longer pauses while they last.
                locked_pause = min(locked_pause * 2, LOCKED_OUTCOME_RETRY_MAX_SECONDS)
                locked_again = self._clock.monotonic() + locked_pause
            if not pending:
                wait = 0.2
                if locked:
                    wait = max(0.0, min(wait, locked_again - self._clock.monotonic()))
                try:
                    pending.append(self._settlements.get(timeout=wait))
                except queue.Empty:
                    if self._events.closed.is_set() and not locked:
                        return
                    continue
            self._take_queued(pending)
            if self.may_gather(pending):
                self._clock.sleep(SETTLE_GATHER_SECONDS)
                self._take_queued(pending)
            pending = [s for s in pending if s is not _CLOSED]
            if not pending:
                continue
            unwritten, reachable = self.write(pending)
            if reachable:
                if unwritten and not locked:
                    locked_pause = LOCKED_OUTCOME_RETRY_SECONDS
                    locked_again = self._clock.monotonic() + locked_pause
                locked.extend(unwritten)
                pending = []
                continue
            self.write_failed_at = self._clock.monotonic()
            if self._events.closed.wait(self.settings.poll_interval_min * 10):
                self._clock.sleep(self.settings.poll_interval_min)  # closing: keep trying

    def _take_queued(self, pending: list[Settlement]) -> None:
        """Move the outcomes queued now into ``pending``, up to a batch."""
        while len(pending) < _SETTLE_BATCH:
            try:
                pending.append(self._settlements.get_nowait())
            except queue.Empty:
                return

    def may_gather(self, pending: list[Settlement]) -> bool:
        """Whether to let more outcomes gather before writing ``pending`` (all that was
        queued): not when the batch is full, nor when one of them is a result whose slot
        stays taken until it is written (the node would start less meanwhile), nor when
        nothing else is running to add to the batch."""
        if len(pending) >= _SETTLE_BATCH or any(s.result is not None for s in pending):
            return False
        return self.still_running()

    def still_running(self) -> bool:
        """Whether a job of this node is running (its outcome is still to come), before the
        node closes. A slot held for a result reported and not written is no running job."""
        if self._events.closed.is_set():
            return False
        return self._holdings.still_running()

    def write(self, settlements: list[Settlement]) -> tuple[list[Settlement], bool]:
        """Write outcomes; returns those not written, and whether the store could be reached.
        While it cannot, none is written: all are kept, to try again later. A row another
        transaction keeps locked is waited on briefly; then the batch is written row by row,
        and only the rows still locked are returned. A batch the database refuses is written
        row by row too, so that one bad row (say, a traceback it cannot store) does not take
        the others down with it."""
        try:
            # A deadlock or a lock that outlasts the wait: the batch goes row by row, at once.
            self._settle_bounded(settlements)
        except StoreUnavailable as exc:
            self._throttle.warn("settle", "ratchet: %s; will retry, nothing is lost", exc)
            return settlements, False
        except StoreBusy:
            return self._write_each(settlements)
        except Exception as exc:
            logger.warning(
                "ratchet: writing %d outcomes failed (%r); one at a time", len(settlements), exc
            )
            return self._write_each(settlements)
        self._throttle.clear("settle", "ratchet: job outcomes are being written again")
        self._written(settlements)
        return [], True

    def _write_each(self, settlements: list[Settlement]) -> tuple[list[Settlement], bool]:
        """Write outcomes one at a time, each waiting briefly on its row's lock; returns those
        not written, the ones not tried first, and whether the store could be reached. When
        the first rows tried all wait on locks (the whole table is locked, by a schema change,
        say), or the store cannot be reached, the rest are not tried this time; they go first
        the next time, so rows that stay locked never hold them back."""
        untried: list[Settlement] = []
        locked: list[Settlement] = []
        written: list[Settlement] = []
        reachable = True
        for settlement in settlements:
            if not reachable or (not written and len(locked) >= _LOCKED_BEFORE_GIVING_UP):
                untried.append(settlement)
                continue
            try:
                (written if self._write_one(settlement) else locked).append(settlement)
            except StoreUnavailable as exc:
                self._throttle.warn("settle", "ratchet: %s; will retry, nothing is lost", exc)
                reachable = False
                untried.append(settlement)
        if written:
            self._written(written)
        if locked:
            self._throttle.warn(
                "settle-locked",
                "ratchet: %d job outcomes wait on locks another transaction holds (an open "
                "transaction that locked those job rows?); the node's other outcomes are "
                "written meanwhile, these are tried again every %.0f-%.0f s",
                len(locked),
                LOCKED_OUTCOME_RETRY_SECONDS,
                LOCKED_OUTCOME_RETRY_MAX_SECONDS,
            )
        elif reachable and not untried:
            self._throttle.clear("settle-locked", "ratchet: held-back job outcomes written")
        return untried + locked, reachable

    def _settle_bounded(self, settlements: list[Settlement]) -> None:
        """The settler's write: waiting on a row's lock only briefly, and not trying again
        after a deadlock or a wait that ran out (the caller writes row by row instead)."""
        self.store.settle(settlements, lock_wait=SETTLE_LOCK_WAIT_SECONDS, retry_conflicts=False)

    def _write_one(self, settlement: Settlement) -> bool:
        """Write one outcome: False while its row stays locked; :class:`StoreUnavailable`
        when the store cannot be reached."""
        try:
            self._settle_bounded([settlement])
            return True
        except StoreBusy:
            return False
        except StoreUnavailable:
            raise
        except Exception as exc:
            logger.exception(
                "ratchet: outcome of job %s refused; writing its status alone", settlement.job_id
            )
            refused = exc
        try:
            self._settle_bounded([_status_alone(settlement, refused)])
        except StoreBusy:
            return False
        except StoreUnavailable:
            raise
        except Exception:
            logger.exception(
                "ratchet: outcome of job %s cannot be written; the job stays "
                "RUNNING until this node's claims are reconciled",
                settlement.job_id,
            )
        return True


def _status_alone(settlement: Settlement, refused: Exception) -> Settlement:
    """What is left to write of an outcome the store refused: its status without its error
    and traceback; a success whose result was refused fails with the refusal, as a result
    backend's refused write fails a task in Celery, rather than succeed with no value."""
    if settlement.result is None:
        return replace(settlement, error=None, traceback=None)
    kind = type(refused)
    error = error_record(kind.__name__, [f"its result was not stored: {refused}"], kind.__module__)
    return replace(settlement, status=JobStatus.FAILED, error=error, traceback=None, result=None)
