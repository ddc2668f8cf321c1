"""The in-memory store's rows: a job, a node, an alert window, a permit, a control message;
and how a job row is written from a :class:`NewJob` and read back as the domain's records."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    JobSummary,
    JobType,
    Message,
    NewJob,
    ResultRecord,
    parse_status,
)
from celery_ratchet.domain.priority import clamped
from celery_ratchet.domain.queue_pause import PausedQueue

PENDING = JobStatus.PENDING.value
RUNNING = JobStatus.RUNNING.value
WAITING = JobStatus.WAITING.value
FAILED = JobStatus.FAILED.value
REVOKED = JobStatus.REVOKED.value
ACTIVE = frozenset({PENDING, RUNNING, JobStatus.PAUSED.value, WAITING})
TERMINAL = frozenset(s.value for s in JobStatus) - ACTIVE
#: What holds a business key: the database's partial unique index, as a predicate.
KEY_HOLDING = frozenset({PENDING, WAITING, RUNNING})
#: ``revoke_requested`` of a revoke without terminate (as ``store.job_rows.REVOKE_ONLY``).
REVOKE_ONLY = "REVOKE"
#: A chain step's due time while it waits for the step before it (``job_rows.WAITING_DUE``).
WAITING_DUE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)


@dataclass
class JobRow:
    """One row of ``scheduler_job``, its columns as the database holds them."""

    id: int
    job_id: str
    task_name: str
    queue: str
    status: str
    job_type: str
    priority: int
    scheduled_time: datetime
    created_at: datetime
    payload: bytes
    content_type: str
    content_encoding: str
    headers: str
    properties: str
    expires_at: datetime | None = None
    attempts: int = 0
    claims: int = 0
    root_id: str | None = None
    parent_id: str | None = None
    group_id: str | None = None
    business_key: str | None = None
    schedule_spec: str | None = None
    resource: str | None = None
    tags: str | None = None
    depends_on: str | None = None
    picked_by: str | None = None
    claim_token: str | None = None
    claimed_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    revoke_requested: str | None = None
    job_result: str | None = None
    result_type: str | None = None
    result_meta: str | None = None
    last_error: str | None = None
    error_traceback: str | None = None

    def held_by(self, job_id: str, token: str | None) -> bool:
        """The compare-and-swap of every write made under a claim (``job_rows._held``)."""
        return self.job_id == job_id and self.claim_token == token and self.status == RUNNING

    def holds_key(self) -> bool:
        return (
            self.business_key is not None
            and self.status in KEY_HOLDING
            and self.job_type != JobType.RECURRING.value
        )

    def clear_claim(self) -> None:
        self.picked_by = self.claim_token = None
        self.claimed_at = self.started_at = None

    def clear_result(self) -> None:
        self.revoke_requested = self.finished_at = None
        self.job_result = self.result_type = self.result_meta = None
        self.last_error = self.error_traceback = None

    def take(self, new: NewJob, now: datetime, *, keep: tuple[str, ...] = ()) -> None:
        """(Re)scheduled as ``new`` says, PENDING, no claims yet; the ``keep`` columns stay."""
        for column, value in job_values(new, now).items():
            if column not in keep:
                setattr(self, column, value)
        self.status = PENDING
        self.claims = 0


def job_values(new: NewJob, now: datetime) -> dict[str, Any]:
    """The columns a (re)scheduled job takes from ``new``."""
    m = new.message
    return {
        "task_name": new.task_name,
        "queue": new.queue,
        "job_type": new.job_type.value,
        "priority": clamped(new.priority),
        "scheduled_time": new.due or now,
        "expires_at": new.expires_at,
        "attempts": new.attempts,
        "root_id": new.root_id,
        "parent_id": new.parent_id,
        "group_id": new.group_id,
        "payload": bytes(m.payload),
        "content_type": m.content_type,
        "content_encoding": m.content_encoding,
        "headers": m.headers,
        "properties": m.properties,
        "business_key": new.business_key,
        "schedule_spec": new.schedule_spec,
        "resource": new.resource,
        "tags": tags_text(new.tags),
    }


def new_row(id_: int, new: NewJob, now: datetime) -> JobRow:
    m = new.message
    row = JobRow(
        id=id_,
        job_id=new.job_id,
        task_name=new.task_name,
        queue=new.queue,
        status=PENDING,
        job_type=new.job_type.value,
        priority=0,
        scheduled_time=now,
        created_at=now,
        payload=bytes(m.payload),
        content_type=m.content_type,
        content_encoding=m.content_encoding,
        headers=m.headers,
        properties=m.properties,
    )
    row.take(new, now)
    return row


#: What a chain step stored ahead writes, over a running row it takes over too
#: (``job_rows._WAITING_COLUMNS`` and the columns the insert gives).
WAITING_COLUMNS = (
    "task_name", "queue", "job_type", "priority", "root_id", "parent_id", "group_id",
    "payload", "content_type", "content_encoding", "headers", "properties", "depends_on",
    "status", "scheduled_time", "created_at", "attempts", "claims",
)  # fmt: skip


def waiting_row(id_: int, step: NewJob, now: datetime) -> JobRow:
    """A chain step stored ahead: WAITING, never claimed, no business key."""
    row = new_row(id_, step, now)
    row.status, row.scheduled_time, row.depends_on = WAITING, WAITING_DUE, step.depends_on
    row.attempts = row.claims = 0
    row.expires_at = row.business_key = row.schedule_spec = row.resource = row.tags = None
    return row


def tags_text(tags: tuple[str, ...]) -> str | None:
    """Tags as stored: ``,a,b,`` (as ``job_rows.tags_text``)."""
    if not tags:
        return None
    for tag in tags:
        if "," in tag or not tag:
            raise ValueError(f"tag {tag!r}: tags are non-empty and contain no comma")
    return "," + ",".join(tags) + ","


def storable(text: str | None) -> str | None:
    """Text as a database stores an outcome's error (``job_rows.storable``): NUL characters
    and lone surrogates escaped."""
    if text is None:
        return None
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


class Unrunnable(Exception):
    """A claimed row that cannot be run as it stands (``store.claim_sql.MalformedRow``)."""


def _json_object(text: str, column: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise Unrunnable(f"its {column} column is not a JSON object")
    return value


def claimed_job(row: JobRow, now: datetime) -> ClaimedJob:
    """The claimed row as a job, checked as ``store.claim_sql.to_claimed`` checks it."""
    try:
        job_type = JobType(row.job_type)
    except ValueError:
        raise Unrunnable(f"job_type {row.job_type!r} is not a known job type") from None
    headers = _json_object(row.headers, "headers")
    properties = _json_object(row.properties, "properties")
    if job_type is not JobType.RECURRING and headers.get("id") != row.job_id:
        raise Unrunnable(f"its message is for task id {headers.get('id')!r}, not the row's")
    if headers.get("task") != row.task_name:
        raise Unrunnable(f"its message runs task {headers.get('task')!r}, not the row's")
    assert row.claim_token is not None
    return ClaimedJob(
        id=row.id,
        job_id=row.job_id,
        task_name=row.task_name,
        queue=row.queue,
        priority=row.priority,
        attempts=row.attempts,
        claims=row.claims,
        token=row.claim_token,
        scheduled_time=row.scheduled_time,
        message=Message(
            row.payload, row.content_type, row.content_encoding, row.headers, row.properties
        ),
        job_type=job_type,
        schedule_spec=row.schedule_spec,
        claimed_now=now,
        resource=row.resource,
        revoke_requested=row.revoke_requested,
        decoded_headers=headers,
        decoded_properties=properties,
    )


def result_record(row: JobRow) -> ResultRecord:
    return ResultRecord(
        job_id=row.job_id,
        task_name=row.task_name,
        status=parse_status(row.status),
        attempts=row.attempts,
        queue=row.queue,
        job_result=row.job_result,
        result_type=row.result_type,
        result_meta=row.result_meta,
        last_error=row.last_error,
        error_traceback=row.error_traceback,
        finished_at=row.finished_at,
        picked_by=row.picked_by,
        headers=row.headers,
        payload=row.payload,
        content_type=row.content_type,
        content_encoding=row.content_encoding,
    )


def summary(row: JobRow) -> JobSummary:
    return JobSummary(
        job_id=row.job_id,
        task_name=row.task_name,
        queue=row.queue,
        status=parse_status(row.status),
        priority=row.priority,
        attempts=row.attempts,
        scheduled_time=row.scheduled_time,
        created_at=row.created_at,
        finished_at=row.finished_at,
        picked_by=row.picked_by,
        last_error=row.last_error,
        business_key=row.business_key,
        tags=row.tags,
        claimed_at=row.claimed_at,
        started_at=row.started_at,
        job_type=row.job_type,
    )


@dataclass
class NodeRow:
    node_id: str
    hostname: str
    pid: int
    queues: str
    concurrency: int
    started_at: datetime
    heartbeat_ts: datetime
    schedule_keys: list[str] | None
    task_names: list[str] | None = None


@dataclass
class Permit:
    """A resource permit one claim holds (``scheduler_resource_permit``)."""

    resource: str
    job_id: str
    node_id: str
    claim_token: str
    acquired_at: datetime


@dataclass
class AlertRow:
    """A task name's dead-letter alert window (``scheduler_dlq_alert``)."""

    task_name: str
    failed: int = 0
    alerts_sent: int = 0
    opened_at: datetime | None = None
    first_opened_at: datetime | None = None
    last_sent_at: datetime | None = None
    last_alert_id: str | None = None
    last_count: int | None = None
    newest_job_id: str | None = None
    newest_error: str | None = None
    newest_at: datetime | None = None


@dataclass
class ControlRow:
    id: int
    command: str
    arguments: str
    destination: str | None
    pattern: str | None
    matcher: str | None
    ticket: str | None
    created_at: datetime
    expires_at: datetime


@dataclass
class ReplyRow:
    id: int
    ticket: str
    hostname: str
    reply: str
    expires_at: datetime


@dataclass
class Tables:
    """Everything the store holds: copied whole to make a write all or nothing."""

    jobs: dict[str, JobRow] = field(default_factory=dict)
    nodes: dict[str, NodeRow] = field(default_factory=dict)
    permits: list[Permit] = field(default_factory=list)
    resources: dict[str, int] = field(default_factory=dict)
    alerts: dict[str, AlertRow] = field(default_factory=dict)
    commands: list[ControlRow] = field(default_factory=list)
    replies: list[ReplyRow] = field(default_factory=list)
    groups: dict[str, str] = field(default_factory=dict)
    paused: dict[str, PausedQueue] = field(default_factory=dict)
    next_id: int = 1

    def take_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1
