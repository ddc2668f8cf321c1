"""What the parts of a node's runtime share: how much work it takes, the outcomes of a
dispatch, the wake-up sources' shape, a throttle for repeated warnings, and its constants."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from celery_ratchet.domain.breaker import BreakerConfig
from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    NewJob,
    Settlement,
)
from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.runtime.clock import Clock
from celery_ratchet.settings import RatchetSettings

logger = logging.getLogger(__name__)

_SETTLE_BATCH = 500
#: A recurring master due but not claimed (claimed by another node meanwhile, or this node
#: cannot claim now) is looked at again this much later.
_MASTER_CHECK_SECONDS = 0.25
#: Wake this much after a known due time, so the database's clock has passed it too.
_DUE_MARGIN_SECONDS = 0.005
#: While no announcement has reached this node, it asks for one this often.
_PROBE_SECONDS = 30.0
#: Recurring masters claimed, and fired in one transaction, at once.
_MASTER_BATCH = 200
#: A recurring master that cannot be planned is retried this much later, not abandoned.
_MASTER_RETRY_SECONDS = 60.0
#: Put in the settler's queue when the runtime closes: nothing to write, just wake up.
_CLOSED = Settlement("", "", JobStatus.PENDING)
#: How long a stopping worker waits to write its last outcomes while the store answers.
SHUTDOWN_WRITE_SECONDS = 5.0
#: How often a worker looks for batches all of whose children ended but that nobody finished.
HOUSEKEEPING_INTERVAL = 10.0

#: Builds the job of one occurrence of a recurring master, for one fire time.
OccurrenceFactory = Callable[[ClaimedJob, MasterSpec, datetime], NewJob]


class WakeupSource(Protocol):
    """Something that calls ``wake(queue)`` when jobs of that queue were committed, and
    ``wake(REVOCATIONS_WAKEUP)`` when running jobs were asked to stop. While its ``live``
    attribute (if it has one) is false, nothing is announced and the worker polls."""

    def start(self, wake: Callable[[str], None]) -> None: ...

    def stop(self) -> None: ...


class Declined(Exception):
    """Raised by a node's ``dispatch`` for a job it will not start here (its task unknown
    to this worker): the job goes back to the store, due ``after_seconds`` from its claim,
    with no attempt counted; or, with ``to_node``, handed to that node alone, due as it was
    (``store/task_handoff.py``)."""

    def __init__(self, after_seconds: float, to_node: str | None = None) -> None:
        super().__init__(f"handed back for {after_seconds}s")
        self.after_seconds = after_seconds
        #: A live node that knows the task: the job is handed to it alone, due at once
        #: (``after_seconds`` unused).
        self.to_node = to_node


#: The circuit breaker a job's task is protected by: (service name, its configuration).
BreakerLookup = Callable[[ClaimedJob], "tuple[str, BreakerConfig] | None"]


@dataclass(frozen=True)
class Capacity:
    """How much work this node takes: ``running`` at once, plus ``buffered`` claimed ahead."""

    running: int
    buffered: int
    #: Jobs that actually execute at once (the pool's processes); 0 means ``running``.
    slots: int = 0
    #: Of the jobs in flight, at most this many single jobs (every kind but batch
    #: children) and this many batch children; 0: no limit by kind.
    single_limit: int = 0
    batch_child_limit: int = 0

    def limit_for(self, job: ClaimedJob) -> int:
        if job.batch_child:
            return self.batch_child_limit
        return self.single_limit

    @property
    def total(self) -> int:
        return self.running + self.buffered

    @property
    def executing(self) -> int:
        return self.slots or self.running


class Throttle:
    """Logs a recurring problem once per interval instead of once per attempt. The store
    being unreachable is logged by the store itself, once per outage: here only at DEBUG.
    Thread-safe."""

    def __init__(self, interval: float, clock: Clock) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()

    def warn(self, key: str, msg: str, *args: object) -> None:
        if any(isinstance(a, StoreUnavailable) for a in args):
            logger.debug(msg, *args)
            return
        now = self._clock.monotonic()
        with self._lock:
            due = now - self._last.get(key, -1e9) >= self.interval
            if due:
                self._last[key] = now
        if due:
            logger.warning(msg, *args)

    def clear(self, key: str, msg: str) -> None:
        with self._lock:
            said = self._last.pop(key, None) is not None
        if said:
            logger.warning(msg)

    def forget(self, key: str) -> None:
        """The problem ended; nothing worth saying about it."""
        with self._lock:
            self._last.pop(key, None)


def throttle_for(settings: RatchetSettings, clock: Clock) -> Throttle:
    return Throttle(max(settings.poll_interval, 5.0), clock)


class NodeEvents:
    """The events a node's threads tell each other by, each set from any thread."""

    def __init__(self) -> None:
        #: No job starts from now (a stop; cleared when claiming resumes).
        self.stopping = threading.Event()
        #: The node closed: every thread of it returns.
        self.closed = threading.Event()
        #: The claim loop looks again: a slot freed, a hint, a stop.
        self.woken = threading.Event()
        #: New work may be due: claim at once rather than at the next idle look.
        self.hint = threading.Event()
        #: Set while the last claim found no more due jobs than it had room for, and no new
        #: work was announced since (see Claimer.accepts_chain_step).
        self.ran_dry = threading.Event()

    def wake(self) -> None:
        """New work may be due (an enqueue notification, recovered orphans): claim now."""
        self.ran_dry.clear()
        self.hint.set()
        self.woken.set()


class Intake:
    """What a node takes: its queues and its capacity. Each is replaced whole (one reference
    assignment, from any thread) and read without a lock."""

    def __init__(self, queues: Sequence[str], capacity: Capacity) -> None:
        self.queues = list(queues)
        self.capacity = capacity
        #: The queues the node's row lists (it registers with ``queues``).
        self._recorded = list(queues)
        self._recording = threading.Lock()

    def record_queues(self, write: Callable[[list[str]], None]) -> None:
        """``write`` the queues to the node's row unless it lists them already. What it
        raises goes to the caller, and the next call writes them again."""
        with self._recording:
            queues = list(self.queues)
            if queues != self._recorded:
                write(queues)
                self._recorded = queues
