"""The jobs a node holds, shared by its threads behind one lock: claimed and buffered, in
flight, their outcomes reported and not written yet, their permits and circuit breakers."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import replace

from celery_ratchet.domain.breaker import BreakerConfig, BreakerState, CircuitBreaker
from celery_ratchet.domain.job import ClaimedJob, Settlement
from celery_ratchet.runtime.base import Capacity

Claim = tuple[str, str]  # (job id, claim token)


class Holdings:
    """Every method is thread-safe; nothing here touches the store or waits on it.

    A job is in exactly one of: buffered (claimed, not started), in flight (handed to the
    executor, or about to be), or unwritten (its outcome reported, its write to come); a
    result reported while the execution still holds its slot is both in flight and
    unwritten. The claim check never takes a job that is somewhere here for a lost claim.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Notified whenever outcomes were written.
        self._outcomes_written = threading.Condition(self._lock)
        self._ready: deque[ClaimedJob] = deque()
        self._in_flight: dict[str, str] = {}  # job id → claim token
        #: With limits by kind: whether each job in flight is a batch child, and how many
        #: of each kind (False: single, True: batch child) are in flight.
        self._kinds: dict[str, bool] = {}
        self._kind_counts = {False: 0, True: 0}
        #: Permits of jobs in flight.
        self._permits: dict[Claim, str] = {}
        #: (breaker, whether this execution is its half-open probe)
        self._protected: dict[Claim, tuple[CircuitBreaker, bool]] = {}
        self._breakers: dict[str, CircuitBreaker] = {}
        #: Outcomes reported but not yet written: queued or in the settler's hands.
        self._unwritten: dict[Claim, Settlement] = {}
        #: Executions that ended with a result not written yet: their slots are freed when
        #: it is.
        self._free_when_written: set[Claim] = set()
        #: This node's registration: one more each time it registers (after being declared
        #: dead, its earlier claims are not its own any more).
        self._epoch = 0

    # -- registration -----------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        with self._lock:
            return self._epoch

    def registered(self) -> int:
        """The node registered (again): claims of an earlier epoch are not its own."""
        with self._lock:
            self._epoch += 1
            return self._epoch

    # -- the buffer -------------------------------------------------------------------------

    def buffer(
        self, jobs: Sequence[ClaimedJob], epoch: int, stopping: threading.Event | None = None
    ) -> bool:
        """Buffer jobs claimed in ``epoch``; False (nothing buffered) when the node has
        registered again since, or ``stopping`` is set."""
        with self._lock:
            if (stopping is not None and stopping.is_set()) or epoch != self._epoch:
                return False
            self._ready.extend(jobs)
            return True

    def rebuffer(self, jobs: Iterable[ClaimedJob]) -> None:
        """Jobs taken from the buffer that go back to it (their deferral failed)."""
        with self._lock:
            self._ready.extend(jobs)

    def take_buffer(self) -> list[ClaimedJob]:
        """Empty the buffer; returns what it held."""
        with self._lock:
            taken = list(self._ready)
            self._ready.clear()
            return taken

    def take_buffered(self, job_id: str, token: str) -> ClaimedJob | None:
        """Take this claim from the buffer, if it is there."""
        with self._lock:
            for job in self._ready:
                if job.job_id == job_id and job.token == token:
                    self._ready.remove(job)
                    return job
            return None

    def start_next(self, capacity: Capacity, stopping: threading.Event) -> ClaimedJob | None:
        """The next buffered job to start, in flight from now (the claim check must never see
        a job that is about to start as a lost claim); None when there is none, no slot is
        free, every kind with jobs waiting is at its limit, or the node is stopping (the
        buffer is handed back instead)."""
        with self._lock:
            if stopping.is_set():
                return None
            if not self._ready or len(self._in_flight) >= capacity.running:
                return None
            job = self._next_startable(capacity)
            if job is None:
                return None
            self._in_flight[job.job_id] = job.token
            if capacity.single_limit or capacity.batch_child_limit:
                self._kinds[job.job_id] = job.batch_child
                self._kind_counts[job.batch_child] += 1
            return job

    def _next_startable(self, capacity: Capacity) -> ClaimedJob | None:
        if not (capacity.single_limit or capacity.batch_child_limit):
            return self._ready.popleft()
        for index, job in enumerate(self._ready):
            limit = capacity.limit_for(job)
            if not limit or self._kind_counts[job.batch_child] < limit:
                del self._ready[index]
                return job
        return None

    # -- in flight --------------------------------------------------------------------------

    def hold_permit(self, job: ClaimedJob) -> None:
        if job.resource is not None:
            with self._lock:
                self._permits[(job.job_id, job.token)] = job.resource

    def with_permit(self, settlement: Settlement) -> Settlement:
        """The outcome with the permit its execution held, which it gives back."""
        with self._lock:
            resource = self._permits.pop((settlement.job_id, settlement.token), None)
        return settlement if resource is None else replace(settlement, resource=resource)

    def unstart(self, job: ClaimedJob) -> None:
        """A job taken from the buffer that does not start here after all: its slot (and
        its permit's place) is free again."""
        with self._lock:
            self._drop_in_flight(job.job_id, job.token)
            self._permits.pop((job.job_id, job.token), None)

    def free(self, job_id: str, token: str) -> None:
        """The execution ended: its slot is free."""
        with self._lock:
            self._drop_in_flight(job_id, token)
            self._permits.pop((job_id, token), None)
            self._protected.pop((job_id, token), None)  # an end with no outcome to count

    def _drop_in_flight(self, job_id: str, token: str) -> None:
        if self._in_flight.get(job_id) == token:
            del self._in_flight[job_id]
            child = self._kinds.pop(job_id, None)
            if child is not None:
                self._kind_counts[child] -= 1

    def token_of(self, job_id: str) -> str | None:
        """The claim token of ``job_id`` in flight."""
        with self._lock:
            return self._in_flight.get(job_id)

    def started(self, job_id: str, token: str) -> bool:
        with self._lock:
            return self._in_flight.get(job_id) == token

    def take_unfinished(self) -> list[Claim]:
        """Empty the in-flight set (the executor stopped); returns the executions it never
        finished. A success whose result waits for the settler is not unfinished."""
        with self._lock:
            unfinished = [c for c in self._in_flight.items() if c not in self._unwritten]
            self._in_flight.clear()
            return unfinished

    # -- counts -----------------------------------------------------------------------------

    def sizes(self) -> tuple[int, int]:
        """(buffered, buffered and in flight)"""
        with self._lock:
            return len(self._ready), len(self._ready) + len(self._in_flight)

    def holds_jobs(self) -> bool:
        with self._lock:
            return bool(self._in_flight or self._ready)

    def permits_held(self) -> int:
        """Permits held by jobs in flight and wanted by buffered ones."""
        with self._lock:
            return len(self._permits) + sum(1 for j in self._ready if j.resource is not None)

    def room_for_step(self, capacity: Capacity) -> int | None:
        """The epoch, when nothing is buffered and there is room for one more job."""
        with self._lock:
            if self._ready or len(self._in_flight) >= capacity.total:
                return None
            return self._epoch

    def still_running(self) -> bool:
        """Whether a job in flight is running (its outcome is still to come). A slot held
        for a result reported and not written is no running job."""
        with self._lock:
            unwritten = self._unwritten
            return any((job, token) not in unwritten for job, token in self._in_flight.items())

    def known_claims(self) -> set[Claim]:
        """Every claim held here, in any state."""
        with self._lock:
            known = set(self._in_flight.items())
            known |= {(j.job_id, j.token) for j in self._ready}
            known |= set(self._unwritten)
            return known

    # -- circuit breakers -------------------------------------------------------------------

    def admit(
        self, job: ClaimedJob, service: str, config: BreakerConfig, now: float
    ) -> float | None:
        """None when ``service``'s breaker lets the job start (it is counted in it then);
        else when (monotonic) to try it again."""
        with self._lock:
            breaker = self._breakers.get(service)
            if breaker is None:
                breaker = self._breakers[service] = CircuitBreaker(config)
            until = breaker.defer_until(now)
            if until is None:
                probe = breaker.state is BreakerState.HALF_OPEN
                self._protected[(job.job_id, job.token)] = (breaker, probe)
            return until

    def count_outcome(self, job_id: str, token: str, failed: bool, now: float) -> None:
        """Count a finished execution in its breaker, if it has one."""
        with self._lock:
            protected = self._protected.pop((job_id, token), None)
            if protected is not None:
                breaker, probe = protected
                breaker.record(failed, now, probe=probe)

    @property
    def breakers(self) -> dict[str, CircuitBreaker]:
        """The breakers by service (a copy)."""
        with self._lock:
            return dict(self._breakers)

    # -- outcomes ---------------------------------------------------------------------------

    def reported(self, settlement: Settlement) -> None:
        with self._lock:
            self._unwritten[(settlement.job_id, settlement.token)] = settlement

    def written(self, settlements: Iterable[Settlement]) -> list[Claim]:
        """Outcomes written; returns the executions whose slots were waiting for that."""
        with self._lock:
            for s in settlements:
                self._unwritten.pop((s.job_id, s.token), None)
            freed = [k for k in self._free_when_written if k not in self._unwritten]
            self._free_when_written.difference_update(freed)
            self._outcomes_written.notify_all()
            return freed

    def unwritten(self, job_id: str, token: str) -> bool:
        with self._lock:
            return (job_id, token) in self._unwritten

    def unwritten_count(self) -> int:
        with self._lock:
            return len(self._unwritten)

    def free_when_written(self, job_id: str, token: str) -> bool:
        """Keep the slot until the result of this execution is written, if it is not yet;
        False: nothing to wait for."""
        with self._lock:
            waiting = (job_id, token) in self._unwritten
            if waiting:
                self._free_when_written.add((job_id, token))
            return waiting

    def wait_results_written(self, timeout: float) -> bool:
        """Until the results reported so far are written; False after ``timeout``."""
        with self._outcomes_written:
            waiting = [k for k, s in self._unwritten.items() if s.result is not None]
            return self._outcomes_written.wait_for(
                lambda: not any(k in self._unwritten for k in waiting), timeout
            )
