"""What a job is, independent of where it is stored and of Celery."""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


class JobStatus(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    REVOKED = "REVOKED"
    #: The task asked for its state not to be recorded (Celery's ``Ignore``).
    IGNORED = "IGNORED"
    #: A recurring master that fires nothing until resumed.
    PAUSED = "PAUSED"
    #: A chain step stored at submission, released when the step before it succeeds.
    WAITING = "WAITING"
    #: A state written through the result backend for a task no ratchet worker runs (Celery's
    #: ``store_result(id, meta, STARTED)`` from another process): read back as written, never
    #: claimed, revoked or recovered.
    EXTERNAL = "EXTERNAL"


#: The queue of recurring masters: every worker claims from it, whatever its ``-Q``.
SCHEDULES_QUEUE = "ratchet.schedules"
#: The wake-up word (in place of a queue name) that says a running job was asked to stop.
REVOCATIONS_WAKEUP = "ratchet.revocations"
#: The wake-up word a worker sends to find out whether announcements reach it at all.
PROBE_WAKEUP = "ratchet.probe"
#: Said by a wake-up channel of the node itself (never sent) when its subscription was lost
#: or is back: what was announced in between is missed, so the node looks at everything.
RESUBSCRIBED_WAKEUP = "ratchet.resubscribed"

ACTIVE_STATUSES = frozenset(
    {JobStatus.PENDING, JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.WAITING}
)
TERMINAL_STATUSES = frozenset(set(JobStatus) - ACTIVE_STATUSES)


def parse_status(text: str) -> JobStatus | str:
    """A stored status. One this version does not know (a row written by hand, by another
    tool or a newer version) stays its text: shown as unknown, never an error."""
    try:
        return JobStatus(text)
    except ValueError:
        return str(text)


def shown_status(status: JobStatus | str) -> str:
    """A status as listings print it; an unknown one says so."""
    return status.value if isinstance(status, JobStatus) else f"UNKNOWN({status})"


class Unreadable:
    """A stored value this version cannot read: a timestamp column holding other text (on
    SQLite nothing stops a hand-written row). Listings show ``unreadable`` in its cell and the
    rest of the row as stored, as they show an unknown status."""

    def __str__(self) -> str:
        return "unreadable"

    def __repr__(self) -> str:
        return "UNREADABLE"


UNREADABLE = Unreadable()


class JobType(str, enum.Enum):
    """The seeds' execution type of a job: its role, stored with it (``job_type``)."""

    #: A job sent on its own (``delay``, ``apply_async``, a callback, a recurring occurrence).
    SINGLE = "SINGLE"
    #: A recurring master: the schedule, which fires occurrences (SINGLE jobs).
    RECURRING = "RECURRING"
    #: The coordinator of a batch: no job row here, the batch's row in ``scheduler_batch``.
    BATCH_PARENT = "BATCH_PARENT"
    #: A member of a group, of a chord's header, of a ``celery_ratchet.batch()``.
    BATCH_CHILD = "BATCH_CHILD"
    #: A step of a chain, its first one included.
    CHAIN_STEP = "CHAIN_STEP"
    #: A conditional branch: of a ``celery_ratchet.workflow()``, or a batch's on_success or
    #: on_failure.
    WORKFLOW_BRANCH = "WORKFLOW_BRANCH"
    #: A join: a chord's body, a workflow's ``join()``.
    WORKFLOW_JOIN = "WORKFLOW_JOIN"
    #: Framework work no user sends: the dead-letter alert (the seeds' DLQ_ALERT).
    SYSTEM = "SYSTEM"


#: The seeds' public type of each execution type: the pattern a job belongs to.
_PUBLIC = {
    JobType.SINGLE: "SINGLE",
    JobType.RECURRING: "RECURRING",
    JobType.BATCH_PARENT: "BATCH",
    JobType.BATCH_CHILD: "BATCH",
    JobType.CHAIN_STEP: "CHAIN",
    JobType.WORKFLOW_BRANCH: "WORKFLOW",
    JobType.WORKFLOW_JOIN: "WORKFLOW",
    JobType.SYSTEM: "SYSTEM",
}


def public_type(job_type: JobType | str) -> str:
    """The public type of a stored execution type; one this version does not know (a row
    written by hand or by a newer version) shows as ``UNKNOWN(...)``."""
    try:
        return _PUBLIC[JobType(job_type)]
    except ValueError:
        return f"UNKNOWN({job_type})"


class OnDuplicate(str, enum.Enum):
    """What a send does when its business key is held by an active job."""

    #: Create nothing; the send's result is the active job's (an idempotent enqueue).
    EXISTING = "existing"
    #: Create nothing; raise DuplicateJob naming the active job.
    RAISE = "raise"


@dataclass(frozen=True)
class Message:
    """A serialized task message: what the worker hands to the executor."""

    payload: bytes
    content_type: str
    content_encoding: str
    headers: str  # JSON object
    properties: str  # JSON object


@dataclass(frozen=True)
class NewJob:
    job_id: str
    task_name: str
    queue: str
    priority: int
    message: Message
    #: When the job becomes due; ``None`` means now, by the database clock.
    due: datetime | None = None
    expires_at: datetime | None = None
    attempts: int = 0
    root_id: str | None = None
    parent_id: str | None = None
    group_id: str | None = None
    job_type: JobType = JobType.SINGLE
    business_key: str | None = None
    schedule_spec: str | None = None
    #: A resource whose permits limit how many such jobs run at once, cluster-wide.
    resource: str | None = None
    tags: tuple[str, ...] = ()
    #: A chain step stored ahead of time: WAITING until this job succeeds.
    depends_on: str | None = None
    #: A chain step stored ahead whose id is the job running now (a task replaced by a chain
    #: whose last step takes its id): the claim token of that job's row, which becomes the
    #: WAITING step in the same write.
    takes_over: str | None = None
    #: With a business key held by an active job: follow that job, or raise.
    on_duplicate: OnDuplicate = OnDuplicate.EXISTING


@dataclass(frozen=True)
class ClaimedJob:
    id: int
    job_id: str
    task_name: str
    queue: str
    priority: int
    attempts: int
    #: How many times this row has been claimed since it was (re)scheduled; >1 means redelivery.
    claims: int
    token: str
    scheduled_time: datetime
    message: Message
    job_type: JobType = JobType.SINGLE
    #: A recurring master's schedule (JSON of :class:`MasterSpec`); None for other jobs.
    schedule_spec: str | None = None
    #: The database clock at the claim.
    claimed_now: datetime | None = None
    #: The resource whose permit this execution holds, if any.
    resource: str | None = None
    #: Set when the job was revoked while an earlier execution of it was running.
    revoke_requested: str | None = None
    #: Which registration of the claiming node this claim belongs to: the executing process
    #: checks it before the job starts (``runtime.fence``).
    fence: str | None = None
    #: The message's headers and properties as the claim decoded them (plain JSON): read
    #: once, where the claim checks them, not again by each reader.
    decoded_headers: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    decoded_properties: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    def with_fence(self, fence: str) -> ClaimedJob:
        """This claim stamped for the process that runs it. A copy of the same fields, made
        without dataclasses.replace(), which costs the claim loop a full __init__ a job."""
        stamped = object.__new__(ClaimedJob)
        stamped.__dict__.update(self.__dict__, fence=fence)
        return stamped

    @functools.cached_property
    def batch_child(self) -> bool:
        """A child of a batch or a group: stored as one, or its message names its group."""
        if self.job_type is JobType.BATCH_CHILD:
            return True
        headers: Any = self.decoded_headers
        if headers is None:
            try:
                headers = json.loads(self.message.headers or "{}")
            except ValueError:
                return False
        return isinstance(headers, dict) and headers.get("group") is not None


@dataclass(frozen=True)
class StoredResult:
    """What the result backend keeps of a success: the value as its serializer encoded it
    (None when there is none, or it could not be encoded), its type's name, and the meta
    (the children a task sent) as JSON."""

    value: str | None
    type_name: str | None
    meta: str | None


@dataclass(frozen=True)
class Settlement:
    """The end of one claimed execution, as the worker saw it."""

    job_id: str
    token: str
    status: JobStatus
    error: str | None = None
    traceback: str | None = None
    #: The resource permit the execution held, released with this write.
    resource: str | None = None
    #: A success whose result the backend keeps: written with the status, as the backend's
    #: own write would (error and traceback cleared).
    result: StoredResult | None = None


@dataclass(frozen=True)
class ResultRecord:
    """What a finished (or running) job says about its result."""

    job_id: str
    task_name: str
    #: A status this version does not know stays text (see :func:`parse_status`).
    status: JobStatus | str
    attempts: int
    queue: str
    job_result: str | None
    result_type: str | None
    result_meta: str | None
    last_error: str | None
    error_traceback: str | None
    #: A timestamp that is no timestamp is :data:`UNREADABLE` (see :class:`Unreadable`).
    finished_at: datetime | Unreadable | None
    picked_by: str | None
    headers: str | None
    payload: bytes | None
    content_type: str | None
    content_encoding: str | None


@dataclass(frozen=True)
class JobSummary:
    """A row of ``ratchet jobs``."""

    job_id: str
    task_name: str
    queue: str
    #: A status this version does not know stays text (see :func:`parse_status`).
    status: JobStatus | str
    priority: int
    attempts: int
    #: A timestamp that is no timestamp is :data:`UNREADABLE` (see :class:`Unreadable`).
    scheduled_time: datetime | Unreadable
    created_at: datetime | Unreadable
    finished_at: datetime | Unreadable | None
    picked_by: str | None
    last_error: str | None = None
    business_key: str | None = None
    tags: str | None = None
    #: When its node claimed it, and when it started (Celery's ``task_track_started``).
    claimed_at: datetime | Unreadable | None = None
    started_at: datetime | Unreadable | None = None
    #: The stored execution type (:class:`JobType`), as text: a row may hold another.
    job_type: str = JobType.SINGLE.value


def error_record(exc_type: str, messages: Sequence[object], module: str) -> str:
    """An exception as stored in ``last_error``: the JSON form Celery's backends use (its
    ``exc_message`` is the exception's args)."""
    return json.dumps({"exc_type": exc_type, "exc_message": list(messages), "exc_module": module})
