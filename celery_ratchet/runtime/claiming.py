"""Claiming due jobs for a node's free room and handing them to the executor in order."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TypeVar

from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    Settlement,
)
from celery_ratchet.errors import StoreBusy, StoreUnavailable
from celery_ratchet.runtime.base import (
    _DUE_MARGIN_SECONDS,
    BreakerLookup,
    Declined,
    Intake,
    NodeEvents,
    Throttle,
)
from celery_ratchet.runtime.channel import Channel
from celery_ratchet.runtime.clock import Clock
from celery_ratchet.runtime.holdings import Holdings
from celery_ratchet.runtime.masters import Masters
from celery_ratchet.runtime.outcomes import Settler
from celery_ratchet.runtime.queue_pauses import PausedQueues
from celery_ratchet.runtime.revocations import Revocations
from celery_ratchet.runtime.standing import Standing
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.ports import QueueStore

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


class Claimer:
    """Owns the claim loop's thread (which also fires the recurring masters) and what it
    keeps between rounds; :meth:`accepts_chain_step` and :meth:`take_released` are called
    from the threads that run tasks."""

    def __init__(
        self,
        store: QueueStore,
        settings: RatchetSettings,
        *,
        node_id: str,
        intake: Intake,
        dispatch: Callable[[ClaimedJob], None],
        breaker_for: BreakerLookup | None,
        holdings: Holdings,
        events: NodeEvents,
        channel: Channel,
        standing: Standing,
        settler: Settler,
        revocations: Revocations,
        masters: Masters | None,
        pauses: PausedQueues,
        clock: Clock,
        throttle: Throttle,
    ) -> None:
        self.store = store
        self.settings = settings
        self.node_id = node_id
        self._intake = intake
        self.dispatch = dispatch
        self.breaker_for = breaker_for
        self._holdings = holdings
        self._events = events
        self._channel = channel
        self._standing = standing
        self._settler = settler
        self._revocations = revocations
        self._masters = masters
        #: The queues an operator paused: none of them is claimed from.
        self._pauses = pauses
        self._clock = clock
        self._throttle = throttle
        #: The process that claims: a forked pool process holds a copy of this object.
        self._pid = os.getpid()
        #: The claim loop's backoff: how long it waits while queues are empty, and when it
        #: claims next.
        self._idle_wait = settings.poll_interval_min
        self._next_claim = 0.0

    def drop_buffer(self, why: str) -> None:
        dropped = len(self._holdings.take_buffer())
        if dropped:
            logger.error("ratchet: dropped %d claimed, unstarted jobs: %s", dropped, why)

    def dispatch_ready(self) -> None:
        if self._standing.stale():
            self.drop_buffer("no heartbeat for too long, the claims may belong to others now")
            return
        deferred: list[tuple[ClaimedJob, datetime]] = []
        declined: list[tuple[ClaimedJob, datetime]] = []
        handed: list[tuple[ClaimedJob, str]] = []
        try:
            self._dispatch_until_full(deferred, declined, handed)
        finally:
            if handed:
                self._hand_to(handed)
            if deferred:
                self._defer(deferred, "ratchet: circuit open; deferred %d jobs (%s)")
            if declined:  # each task named once at WARNING by the dispatcher
                self._defer(
                    declined,
                    "ratchet: handed back %d jobs of tasks unknown here (%s)",
                    logging.DEBUG,
                )

    def _dispatch_until_full(
        self,
        deferred: list[tuple[ClaimedJob, datetime]],
        declined: list[tuple[ClaimedJob, datetime]],
        handed: list[tuple[ClaimedJob, str]],
    ) -> None:
        while True:
            job = self._holdings.start_next(self._intake.capacity, self._events.stopping)
            if job is None:
                return
            until = self._breaker_hold(job)
            if until is not None:
                self._holdings.unstart(job)
                deferred.append((job, until))
                continue
            self._holdings.hold_permit(job)
            try:
                self.dispatch(job)
            except Declined as declining:
                self._holdings.unstart(job)
                if declining.to_node is not None:
                    handed.append((job, declining.to_node))
                    continue
                claimed_at = job.claimed_now or self._clock.now()
                declined.append((job, claimed_at + timedelta(seconds=declining.after_seconds)))
            except Exception as exc:
                logger.exception("ratchet: could not start job %s", job.job_id)
                self._settler.settle(
                    Settlement(
                        job.job_id,
                        job.token,
                        JobStatus.FAILED,
                        error=f"could not start the job: {exc!r}",
                    )
                )

    def _breaker_hold(self, job: ClaimedJob) -> datetime | None:
        """When the job's circuit breaker is open: the time to try it again."""
        if self.breaker_for is None:
            return None
        try:
            found = self.breaker_for(job)
        except Exception as exc:  # a bad breaker setting must not stop the claim loop
            self._throttle.warn(
                f"breaker:{job.task_name}",
                "ratchet: no circuit breaker for %s: %s",
                job.task_name,
                exc,
            )
            return None
        if found is None:
            return None
        service, config = found
        now = self._clock.monotonic()
        until = self._holdings.admit(job, service, config, now)
        if until is None:
            return None
        claimed_at = job.claimed_now or self._clock.now()
        return claimed_at + timedelta(seconds=until - now)

    def _hand_to(self, handed: list[tuple[ClaimedJob, str]]) -> None:
        """Hand jobs of tasks unknown here to nodes that know them (each task named once at
        WARNING by the dispatcher)."""
        done = "ratchet: handed %d jobs of tasks unknown here to nodes that know them (%s)"
        self._give_back(handed, self.store.hand_to, "handed over", done, logging.DEBUG)

    def _defer(
        self, deferred: list[tuple[ClaimedJob, datetime]], done: str, level: int = logging.INFO
    ) -> None:
        """Put jobs back, due at the given times (a service's breaker open: when it
        half-opens); they lose no attempt."""
        self._give_back(deferred, self.store.defer, "deferred", done, level)

    def _give_back(
        self,
        jobs: list[tuple[ClaimedJob, _T]],
        write: Callable[[list[tuple[str, str, _T]]], object],
        what: str,
        done: str,
        level: int,
    ) -> None:
        """Write claimed jobs back as ``write`` does, each with its own value (a node, a due
        time). If that fails they stay claimed and buffered, and are given back next round."""
        try:
            write([(job.job_id, job.token, value) for job, value in jobs])
        except Exception as exc:
            self._throttle.warn(what, f"ratchet: jobs not {what} yet: %s", exc)
            self._holdings.rebuffer(job for job, _ in jobs)
            return
        logger.log(level, done, len(jobs), ", ".join(sorted({job.task_name for job, _ in jobs})))

    def _room(self) -> tuple[int, bool]:
        """How many jobs to claim, and whether it is time to: the local buffer is down to half
        (so claims come in batches, not one per finished job)."""
        capacity = self._intake.capacity
        ready, held = self._holdings.sizes()
        room = min(capacity.total - held, self.settings.claim_batch_size)
        return room, ready <= capacity.buffered // 2

    def _claim(self, room: int) -> list[ClaimedJob]:
        # Jobs that need a permit first: few at a time, and never starved by the rest. A node
        # holds no more of them than it can execute at once, so a permit is never held by a
        # job queued behind others while another node sits idle.
        claimed: list[ClaimedJob] = []
        held = self._holdings.permits_held()
        permit_room = max(0, self._intake.capacity.executing - held)
        queues = self._pauses.claimable(self._intake.queues)
        if not queues:
            return claimed
        for resource, capacity in self.settings.resources.items():
            if min(room, permit_room) > len(claimed):
                claimed += self._claim_with(
                    self.store.claim_for_resource,
                    self.node_id,
                    queues,
                    resource,
                    capacity,
                    min(room, permit_room) - len(claimed),
                )
        if room > len(claimed):
            claimed += self._claim_with(self.store.claim, self.node_id, queues, room - len(claimed))
        return claimed

    def _claim_with(
        self, claim: Callable[..., list[ClaimedJob]], *args: object
    ) -> list[ClaimedJob]:
        try:
            claimed = claim(*args)
        except StoreUnavailable as exc:
            self._throttle.warn("claim", "ratchet: %s; retrying", exc)
            return []
        except StoreBusy as exc:
            # Lock conflicts (certification conflicts on Galera): the store was reachable
            # all along, so their end is no "reachable again".
            self._throttle.warn("claim-busy", "ratchet: claim deferred: %s; retrying", exc)
            return []
        except Exception:
            logger.exception("ratchet: claim failed")
            return []
        self._throttle.clear("claim", "ratchet: job store reachable again")
        self._throttle.forget("claim-busy")
        return claimed

    def run(self) -> None:
        """The claim loop, until the node stops claiming."""
        self._idle_wait, self._next_claim = self.settings.poll_interval_min, 0.0
        stopping = self._events.stopping
        while not stopping.is_set():
            try:
                self._events.woken.clear()  # before looking: a change after this wakes the wait
                timeout = self.round()
                if timeout is not None:
                    self._events.woken.wait(timeout)
            except Exception:  # keep claiming: a dead poller would strand this node
                logger.exception("ratchet: claim loop error; continuing")
                stopping.wait(self.settings.poll_interval)

    def round(self) -> float | None:
        """One look: fire the masters due, start buffered jobs, claim if there is room.
        Returns how long to wait until the next (a slot freed or a hint ends it sooner), or
        None to look again at once (a full claim: there may be more due)."""
        settings = self.settings
        self._channel.probe()
        if self._masters is not None:
            self._masters.fire_due()
        self.dispatch_ready()
        room, low = self._room()
        wants_work = room > 0 and low and not self._standing.stale()
        hint = self._events.hint
        if wants_work and (hint.is_set() or self._clock.monotonic() >= self._next_claim):
            hint.clear()
            epoch = self._holdings.epoch
            self._pauses.refresh(self._intake.queues)
            claimed = self._claim(room)
            revoked = self._revocations.drop_revoked(claimed)
            if revoked:
                claimed = [j for j in claimed if j not in revoked]
            if len(claimed) < room:
                self._events.ran_dry.set()
            else:
                self._events.ran_dry.clear()
            if claimed:
                self._take(claimed, epoch)
                self.dispatch_ready()
            if len(claimed) == room:  # there may be more due: claim again at once
                self._idle_wait, self._next_claim = settings.poll_interval_min, 0.0
                return None
            # The queue ran dry: back off, doubling up to the poll interval.
            self._idle_wait = (
                settings.poll_interval_min
                if claimed
                else min(self._idle_wait * 2, settings.poll_interval)
            )
            self._next_claim = self._clock.monotonic() + self._idle_wait
            if not claimed and self._channel.told():
                self._next_claim = self._next_claim_when_told(self._next_claim)
            if self._pauses.holds_any_of(self._intake.queues):
                # A resume is looked for while idle too, however long the wait would be.
                self._next_claim = min(
                    self._next_claim, self._clock.monotonic() + self._pauses.max_age
                )
        # Sleep until a slot frees, a wake-up hint arrives, or the next claim is due.
        timeout = (
            max(0.0, self._next_claim - self._clock.monotonic())
            if wants_work
            else settings.poll_interval
        )
        if self._masters is not None:
            timeout = min(timeout, self._masters.next_look_in())
        return timeout

    def accepts_chain_step(self, queue: str) -> int | None:
        """Whether a chain step of ``queue``, released by a task running in this process,
        may be released as claimed by this node (``release_step_to``): the epoch to hand
        it over with (:meth:`take_released`), or None to release it as usual. Only while
        this node's last claim found no more due jobs than it had room for, so the step
        goes ahead of no backlog, and while it has room for it."""
        if (
            os.getpid() != self._pid  # a pool process's copy of the runtime
            or queue not in self._intake.queues
            or queue in self._pauses.paused
            or not self._events.ran_dry.is_set()
            or self._events.stopping.is_set()
            or self._standing.stale()
        ):
            return None
        return self._holdings.room_for_step(self._intake.capacity)

    def take_released(self, job: ClaimedJob, epoch: int) -> None:
        """A chain step released as claimed by this node: buffered at once, as a claim of
        its own is (a revoke from now on finds it there), and started by the claim loop."""
        if self._holdings.buffer(
            self._standing.stamped([job], epoch), epoch, self._events.stopping
        ):
            self._events.woken.set()
            return
        # Stopping meanwhile (the buffer was handed back already), or declared dead and
        # registered again since (claims of before are not ours to start): handed back.
        self._settler.hand_back(job)

    def _take(self, claimed: list[ClaimedJob], epoch: int) -> None:
        """Buffer jobs just claimed, unless this node was declared dead (and registered
        again) meanwhile: then the claims are handed back, never started."""
        if not self._holdings.buffer(self._standing.stamped(claimed, epoch), epoch):
            for job in claimed:
                self._settler.hand_back(job)
            logger.warning(
                "ratchet: handing back %d jobs claimed before this node was declared dead",
                len(claimed),
            )

    def _next_claim_when_told(self, backoff: int | float) -> float:
        """With a wake-up channel, an empty claim need not be repeated every poll interval:
        new jobs are announced. Sleep until the earliest pending job of our queues is due
        (a countdown, a retry, a deferred job), at most the safety interval; a job due but
        not claimed (its permits taken) is tried again after the usual backoff."""
        try:
            queues = self._pauses.claimable(self._intake.queues)
            due_in = self.store.next_due_in(queues, self.node_id) if queues else None
        except Exception as exc:
            self._throttle.warn("due", "ratchet: next due time not read: %s", exc)
            return float(backoff)
        now = self._clock.monotonic()
        if due_in is None:
            return now + self._channel.idle_look()
        if due_in <= 0:
            return float(backoff)
        return now + min(due_in + _DUE_MARGIN_SECONDS, self._channel.idle_look())
