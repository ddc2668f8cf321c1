"""Claiming due jobs for a node's free room and handing them to the executor in order."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import datetime, timedelta

from celery_ratchet.domain.breaker import BreakerState, CircuitBreaker
from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    Settlement,
)
from celery_ratchet.errors import StoreBusy, StoreUnavailable
from celery_ratchet.runtime.base import (
    _DUE_MARGIN_SECONDS,
    Declined,
)
from celery_ratchet.runtime.masters import MasterFiring
from celery_ratchet.runtime.revocations import Revocations

logger = logging.getLogger(__name__)


class Claiming(MasterFiring, Revocations):
    """Claiming due jobs for a node's free room and handing them to the executor in order."""

    def _drop_buffer(self, why: str) -> None:
        with self._lock:
            dropped = len(self._ready)
            self._ready.clear()
        if dropped:
            logger.error("ratchet: dropped %d claimed, unstarted jobs: %s", dropped, why)

    def _dispatch_ready(self) -> None:
        if self._heartbeat_stale():
            self._drop_buffer("no heartbeat for too long, the claims may belong to others now")
            return
        deferred: list[tuple[ClaimedJob, datetime]] = []
        declined: list[tuple[ClaimedJob, datetime]] = []
        try:
            self._dispatch_until_full(deferred, declined)
        finally:
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
    ) -> None:
        while True:
            with self._lock:
                if self._stopping.is_set():  # stopping: the buffer is handed back instead
                    return
                if not self._ready or len(self._in_flight) >= self.capacity.running:
                    return
                job = self._next_startable()
                if job is None:  # every kind with jobs waiting is at its limit
                    return
                # In flight from the moment it leaves the buffer: the claim check
                # (_reconcile) must never see a job that is about to start as a lost claim.
                self._in_flight[job.job_id] = job.token
                self._count_kind(job)
            until = self._breaker_hold(job)
            if until is not None:
                self._unstart(job)
                deferred.append((job, until))
                continue
            with self._lock:
                if job.resource is not None:
                    self._permits[(job.job_id, job.token)] = job.resource
            try:
                self.dispatch(job)
            except Declined as declining:
                self._unstart(job)
                claimed_at = job.claimed_now or self._clock.now()
                declined.append((job, claimed_at + timedelta(seconds=declining.after_seconds)))
            except Exception as exc:
                logger.exception("ratchet: could not start job %s", job.job_id)
                self.settle(
                    Settlement(
                        job.job_id,
                        job.token,
                        JobStatus.FAILED,
                        error=f"could not start the job: {exc!r}",
                    )
                )

    def _unstart(self, job: ClaimedJob) -> None:
        """A job taken from the buffer that does not start here after all: its slot (and
        its permit's place) is free again."""
        with self._lock:
            if self._in_flight.get(job.job_id) == job.token:
                del self._in_flight[job.job_id]
                self._uncount_kind(job.job_id)
            self._permits.pop((job.job_id, job.token), None)

    def _next_startable(self) -> ClaimedJob | None:
        """The first buffered job whose kind is under its limit, taken from the buffer
        (under the lock)."""
        capacity = self.capacity
        if not (capacity.single_limit or capacity.batch_child_limit):
            return self._ready.popleft()
        for index, job in enumerate(self._ready):
            child = job.batch_child
            limit = capacity.limit_for(job)
            if not limit or self._kind_counts[child] < limit:
                del self._ready[index]
                return job
        return None

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
        with self._lock:
            breaker = self.breakers.get(service)
            if breaker is None:
                breaker = self.breakers[service] = CircuitBreaker(config)
            until = breaker.defer_until(now)
            if until is None:
                probe = breaker.state is BreakerState.HALF_OPEN
                self._protected[(job.job_id, job.token)] = (breaker, probe)
                return None
        claimed_at = job.claimed_now or self._clock.now()
        return claimed_at + timedelta(seconds=until - now)

    def _defer(
        self, deferred: list[tuple[ClaimedJob, datetime]], done: str, level: int = logging.INFO
    ) -> None:
        """Put jobs back, due at the given times (a service's breaker open: when it
        half-opens); they lose no attempt."""
        try:
            self.store.defer([(job.job_id, job.token, due) for job, due in deferred])
        except Exception as exc:  # kept claimed and buffered: deferred again next round
            self._throttle.warn("defer", "ratchet: jobs not deferred yet: %s", exc)
            with self._lock:
                self._ready.extend(job for job, _ in deferred)
            return
        logger.log(
            level,
            done,
            len(deferred),
            ", ".join(sorted({job.task_name for job, _ in deferred})),
        )

    def _room(self) -> tuple[int, bool]:
        """How many jobs to claim, and whether it is time to: the local buffer is down to half
        (so claims come in batches, not one per finished job)."""
        with self._lock:
            ready, held = len(self._ready), len(self._ready) + len(self._in_flight)
        room = min(self.capacity.total - held, self.settings.claim_batch_size)
        return room, ready <= self.capacity.buffered // 2

    def _claim(self, room: int) -> list[ClaimedJob]:
        # Jobs that need a permit first: few at a time, and never starved by the rest. A node
        # holds no more of them than it can execute at once, so a permit is never held by a
        # job queued behind others while another node sits idle.
        claimed: list[ClaimedJob] = []
        with self._lock:
            held = len(self._permits) + sum(1 for j in self._ready if j.resource is not None)
        permit_room = max(0, self.capacity.executing - held)
        for resource, capacity in self.settings.resources.items():
            if min(room, permit_room) > len(claimed):
                claimed += self._claim_with(
                    self.store.claim_for_resource,
                    self.node_id,
                    self.queues,
                    resource,
                    capacity,
                    min(room, permit_room) - len(claimed),
                )
        if room > len(claimed):
            claimed += self._claim_with(
                self.store.claim, self.node_id, self.queues, room - len(claimed)
            )
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

    def _poll_loop(self) -> None:
        settings = self.settings
        idle_wait = settings.poll_interval_min
        next_claim = 0.0
        while not self._stopping.is_set():
            try:
                self._wake.clear()  # before looking: a change made after this wakes the wait below
                self._probe()
                self._fire_due_masters()
                self._dispatch_ready()
                room, low = self._room()
                wants_work = room > 0 and low and not self._heartbeat_stale()
                if wants_work and (self._hint.is_set() or self._clock.monotonic() >= next_claim):
                    self._hint.clear()
                    with self._lock:
                        epoch = self._epoch
                    claimed = self._claim(room)
                    revoked = self._drop_revoked(claimed)
                    if revoked:
                        claimed = [j for j in claimed if j not in revoked]
                    self._ran_dry = len(claimed) < room
                    if claimed:
                        self._take(claimed, epoch)
                        self._dispatch_ready()
                    if len(claimed) == room:  # there may be more due: claim again at once
                        idle_wait, next_claim = settings.poll_interval_min, 0.0
                        continue
                    # The queue ran dry: back off, doubling up to the poll interval.
                    idle_wait = (
                        settings.poll_interval_min
                        if claimed
                        else min(idle_wait * 2, settings.poll_interval)
                    )
                    next_claim = self._clock.monotonic() + idle_wait
                    if not claimed and self._told():
                        next_claim = self._next_claim_when_told(next_claim)
                # Sleep until a slot frees, a wake-up hint arrives, or the next claim is due.
                timeout = (
                    max(0.0, next_claim - self._clock.monotonic())
                    if wants_work
                    else (settings.poll_interval)
                )
                if self.occurrence is not None:
                    masters_at = min(self._master_due, self._master_look)
                    if self._masters_changed.is_set():
                        masters_at = 0.0
                    timeout = min(timeout, max(0.0, masters_at - self._clock.monotonic()))
                self._wake.wait(timeout)
            except Exception:  # keep claiming: a dead poller would strand this node
                logger.exception("ratchet: claim loop error; continuing")
                self._stopping.wait(settings.poll_interval)

    def accepts_chain_step(self, queue: str) -> int | None:
        """Whether a chain step of ``queue``, released by a task running in this process,
        may be released as claimed by this node (``release_step_to``): the epoch to hand
        it over with (:meth:`take_released`), or None to release it as usual. Only while
        this node's last claim found no more due jobs than it had room for, so the step
        goes ahead of no backlog, and while it has room for it."""
        if (
            os.getpid() != self._pid  # a pool process's copy of the runtime
            or queue not in self.queues
            or not self._ran_dry
            or self._stopping.is_set()
            or self._heartbeat_stale()
        ):
            return None
        with self._lock:
            if self._ready or len(self._in_flight) >= self.capacity.total:
                return None
            return self._epoch

    def take_released(self, job: ClaimedJob, epoch: int) -> None:
        """A chain step released as claimed by this node: buffered at once, as a claim of
        its own is (a revoke from now on finds it there), and started by the claim loop."""
        stamped = self._stamped([job], epoch)
        with self._lock:
            if not self._stopping.is_set() and epoch == self._epoch:
                self._ready.extend(stamped)
                self._wake.set()
                return
        # Stopping meanwhile (the buffer was handed back already), or declared dead and
        # registered again since (claims of before are not ours to start): handed back.
        self._report(Settlement(job.job_id, job.token, JobStatus.PENDING, resource=job.resource))

    def _take(self, claimed: list[ClaimedJob], epoch: int) -> None:
        """Buffer jobs just claimed, unless this node was declared dead (and registered
        again) meanwhile: then the claims are handed back, never started."""
        stamped = self._stamped(claimed, epoch)
        with self._lock:
            current = epoch == self._epoch
            if current:
                self._ready.extend(stamped)
        if not current:
            for job in claimed:
                self._report(
                    Settlement(job.job_id, job.token, JobStatus.PENDING, resource=job.resource)
                )
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
            due_in = self.store.next_due_in(self.queues)
        except Exception as exc:
            self._throttle.warn("due", "ratchet: next due time not read: %s", exc)
            return float(backoff)
        now = self._clock.monotonic()
        if due_in is None:
            return now + self._idle_look
        if due_in <= 0:
            return float(backoff)
        return now + min(due_in + _DUE_MARGIN_SECONDS, self._idle_look)
