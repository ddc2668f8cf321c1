"""Claiming a batch of due jobs: one statement or one short transaction per batch, per dialect.

Each strategy moves up to ``limit`` due PENDING rows of the given queues to RUNNING, owned by
``node_id`` under a fresh claim token, best first, and returns them: by effective priority
(priority raised as the job waits, see ``domain.priority``), then due time, then id. Rows
another claimer holds are skipped, never waited for.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from sqlalchemy import text
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql.selectable import TextualSelect

from celery_ratchet.domain.job import ClaimedJob, JobType, Message
from celery_ratchet.domain.priority import BOOST_STEP, MAX_PRIORITY, MIN_PRIORITY
from celery_ratchet.store.raw import RawStatement, fetch_on, raw_statement
from celery_ratchet.store.schema import KeptDateTime

RETURNED = (
    "id, job_id, task_name, queue, priority, attempts, claims, scheduled_time, "
    "payload, content_type, content_encoding, headers, properties, job_type, schedule_spec, "
    "resource, revoke_requested"
)
_ORDER = "ORDER BY priority DESC, scheduled_time, id"
#: A pending row handed to one node (``picked_by``, see ``store/task_handoff.py``) is that
#: node's alone to claim: rare, so a filter on the rows the index finds, not a scan.
_DUE = (
    "status = 'PENDING' AND queue IN ({queues}) AND scheduled_time <= {now} AND {resource} "
    "AND (picked_by IS NULL OR picked_by = :node)"
)
CLAIMED_SET = (
    "status = 'RUNNING', picked_by = :node, claim_token = :token, claimed_at = {now}, "
    "started_at = NULL, claims = claims + 1"
)
#: Levels the aging merge reads one by one. The store clamps priorities into 0-9; rows
#: written otherwise (before that, up to 255, or by hand, below 0) are read by the first and
#: last parts, so none is ever left behind. Each of 0-9 is a level of its own: a range
#: (``priority <= 0``) is not in (due time, id) order in the index, so the database would
#: sort every pending row of priority 0 on each claim, a cost growing with the backlog.
_LEVEL_CONDITIONS = (
    [f"priority < {MIN_PRIORITY}"]
    + [f"priority = {p}" for p in range(MIN_PRIORITY, MAX_PRIORITY + 1)]
    + [f"priority > {MAX_PRIORITY}"]
)


@dataclass(frozen=True)
class ClaimShape:
    """What one claim statement is compiled for: the worker's queue count, whether it claims
    jobs of one resource (else jobs with none), and the aging interval (0: no aging)."""

    queues: int
    resource: bool = False
    boost_minutes: float = 0.0


def _due(now: str, shape: ClaimShape) -> str:
    # One bind parameter per queue, not an expanding IN: a worker's queues never change, so
    # the statement compiles once instead of on every claim.
    return _DUE.format(
        now=now,
        queues=", ".join(f":q{i}" for i in range(shape.queues)),
        resource="resource = :resource" if shape.resource else "resource IS NULL",
    )


def _waited_minutes(kind: str, now: str) -> str:
    return {
        # Epochs, not their difference: a due time of -infinity (written by hand) ranks first
        # rather than fail every claim of its queues ("cannot subtract infinite timestamps").
        "postgresql": f"((EXTRACT(EPOCH FROM {now}) - EXTRACT(EPOCH FROM scheduled_time)) / 60.0)",
        "mysql": f"(TIMESTAMPDIFF(MICROSECOND, scheduled_time, {now}) / 60000000.0)",
        "sqlite": f"((julianday({now}) - julianday(scheduled_time)) * 1440.0)",
    }[kind]


def _effective(kind: str, now: str, boost_minutes: float) -> str:
    """Effective priority (``domain.priority.effective_priority``) as SQL."""
    intervals = f"{_waited_minutes(kind, now)} / {boost_minutes!r}"
    # Rows are due, so the wait is never negative: SQLite's truncation is the floor.
    steps = f"CAST({intervals} AS INTEGER)" if kind == "sqlite" else f"FLOOR({intervals})"
    return f"(priority + {BOOST_STEP} * {steps})"


def candidates(
    kind: str, now: str, shape: ClaimShape, columns: str, lock: bool, limit: int | None = None
) -> str:
    """A SELECT of ``columns`` of the due rows to claim, best first, ``limit`` of them (a
    number written into the SQL), or ``:limit`` (a bound parameter) when None.

    Without aging one index scan in (priority desc, due time) order serves it. With aging the
    order depends on the clock, so no index holds it; but within one priority level the
    effective priority only grows with the wait, so the best ``limit`` rows overall are among
    the ``limit`` oldest of each level: read those (twelve short index range scans) and order
    that handful. Exact, and its cost does not grow with the backlog.
    """
    lock_clause = " FOR UPDATE SKIP LOCKED" if lock else ""
    due = _due(now, shape)
    most = ":limit" if limit is None else str(int(limit))
    if not shape.boost_minutes:
        return f"SELECT {columns} FROM scheduler_job WHERE {due} {_ORDER} LIMIT {most}{lock_clause}"
    order = f"ORDER BY {_effective(kind, now, shape.boost_minutes)} DESC, scheduled_time, id"
    level = f"ORDER BY scheduled_time, id LIMIT {most}"
    if kind == "postgresql":
        # FOR UPDATE is refused inside UNION: each level is an ARRAY(...) of locked ids.
        parts = [
            f"ARRAY(SELECT id FROM scheduler_job WHERE {due} AND {level_is} {level}{lock_clause})"
            for level_is in _LEVEL_CONDITIONS
        ]
        return (
            f"SELECT {columns} FROM scheduler_job WHERE id = ANY({' || '.join(parts)}) "
            f"{order} LIMIT {most}"
        )
    if kind == "mysql":
        parts = [
            f"(SELECT {columns} FROM scheduler_job WHERE {due} AND {level_is} {level}{lock_clause})"
            for level_is in _LEVEL_CONDITIONS
        ]
    else:  # SQLite: LIMIT inside a compound SELECT needs a sub-select of its own
        parts = [
            f"SELECT * FROM (SELECT {columns} FROM scheduler_job WHERE {due} AND {level_is} "
            f"{level})"
            for level_is in _LEVEL_CONDITIONS
        ]
    return f"SELECT * FROM ({' UNION ALL '.join(parts)}) AS c {order} LIMIT {most}"


def _queue_params(queues: Sequence[str]) -> dict[str, str]:
    return {f"q{i}": q for i, q in enumerate(queues)}


def _params(
    node_id: str, token: str, queues: Sequence[str], limit: int, resource: str | None
) -> dict[str, Any]:
    params: dict[str, Any] = {"node": node_id, "token": token, "limit": limit}
    params.update(_queue_params(queues))
    if resource is not None:
        params["resource"] = resource
    return params


def prepared(sql: str) -> TextualSelect:
    return text(sql).columns(scheduled_time=KeptDateTime(), claimed_now=KeptDateTime())


class MalformedRow(Exception):
    """A claimed row that cannot be run as it stands: failed, never handed to a worker."""

    def __init__(self, id_: int, job_id: str, reason: str) -> None:
        self.id = id_
        self.job_id = job_id
        self.reason = reason
        super().__init__(reason)


@dataclass(frozen=True)
class Claimed:
    """One claim's rows: the jobs to run, and the rows that could not be decoded."""

    jobs: list[ClaimedJob]
    malformed: list[MalformedRow]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _json_object(text: Any, column: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except RecursionError:
        raise ValueError(
            f"its {column} column nests deeper than the JSON decoder recurses"
        ) from None
    except ValueError:
        value = None
    except Exception as exc:  # whatever decoding raised: the row, not the claim, fails
        raise ValueError(f"its {column} column cannot be decoded ({type(exc).__name__})") from None
    if not isinstance(value, dict):
        raise ValueError(f"its {column} column is not a JSON object")
    return value


def to_claimed(row: Any, token: str, claims_offset: int = 0) -> ClaimedJob:
    """The claimed row as a job; :class:`MalformedRow` when the row cannot be run as it is
    (written by hand or by another tool): an unknown job type, a message that is no JSON
    object, or a message whose task id is not the row's (the row is the truth)."""
    try:
        job_type = JobType(row.job_type)
    except ValueError:
        known = ", ".join(t.value for t in JobType)
        raise MalformedRow(
            row.id, row.job_id, f"job_type {_shown(row.job_type)} is not one of {known}"
        ) from None
    try:
        headers = _json_object(row.headers, "headers")
        properties = _json_object(row.properties, "properties")
    except ValueError as exc:
        raise MalformedRow(row.id, row.job_id, str(exc)) from None
    # A recurring master's message is a template: its occurrences get their own ids.
    if job_type is not JobType.RECURRING and headers.get("id") != row.job_id:
        raise MalformedRow(
            row.id,
            row.job_id,
            f"its message is for task id {_shown(headers.get('id'))}, not for the row's "
            f"job_id {_shown(row.job_id)}",
        )
    if headers.get("task") != row.task_name:
        raise MalformedRow(
            row.id,
            row.job_id,
            f"its message runs task {_shown(headers.get('task'))}, not the row's "
            f"task_name {_shown(row.task_name)}",
        )
    if not isinstance(row.scheduled_time, datetime):
        raise MalformedRow(
            row.id,
            row.job_id,
            f"its scheduled_time {_shown(row.scheduled_time)} is not a timestamp",
        )
    payload = row.payload
    return ClaimedJob(
        id=row.id,
        job_id=row.job_id,
        task_name=row.task_name,
        queue=row.queue,
        priority=row.priority,
        attempts=row.attempts,
        claims=row.claims + claims_offset,
        token=token,
        scheduled_time=row.scheduled_time,
        message=Message(
            payload=bytes(payload) if not isinstance(payload, bytes) else payload,
            content_type=row.content_type,
            content_encoding=row.content_encoding,
            headers=row.headers,
            properties=row.properties,
        ),
        job_type=job_type,
        schedule_spec=row.schedule_spec,
        claimed_now=getattr(row, "claimed_now", None),
        resource=row.resource,
        revoke_requested=row.revoke_requested,
        decoded_headers=headers,
        decoded_properties=properties,
    )


def decode(rows: Sequence[Any], token: str, claims_offset: int = 0) -> Claimed:
    """Each claimed row on its own: one that cannot be decoded never holds back the rest."""
    jobs: list[ClaimedJob] = []
    malformed: list[MalformedRow] = []
    for row in rows:
        try:
            jobs.append(to_claimed(row, token, claims_offset))
        except MalformedRow as exc:
            malformed.append(exc)
        except Exception as exc:  # a column no check foresaw: never the whole batch
            reason = f"it cannot be decoded ({type(exc).__name__})"
            malformed.append(MalformedRow(row.id, row.job_id, reason))
    return Claimed(jobs, malformed)


class ClaimStrategy(Protocol):
    #: Whether :meth:`claim` must run inside a transaction the caller opens.
    needs_transaction: bool

    def claim(self, conn: Connection, shape: ClaimShape, params: dict[str, Any]) -> Claimed:
        """Move up to ``params['limit']`` due rows to RUNNING under ``params['token']``."""
        ...


class UpdateReturning:
    """One ``UPDATE … RETURNING`` claims the rows; ``where`` picks them from the candidates."""

    kind: str
    lock: bool
    needs_transaction: bool
    where: str
    #: Whether the batch size is written into the statement (one statement per size) rather
    #: than bound: see :class:`PostgresClaim`.
    sized: bool = False

    def __init__(self, now: str) -> None:
        self.now = now
        # One strategy per store, a few shapes (and sizes) per worker: compiled once each,
        # kept with the store (a process-wide cache would be shared by every store the
        # process opens).
        self._statements: dict[tuple[ClaimShape, int | None], TextualSelect] = {}
        self._raw: dict[tuple[ClaimShape, int | None, Dialect], RawStatement] = {}

    def statement(self, shape: ClaimShape, limit: int | None = None) -> TextualSelect:
        found = self._statements.get((shape, limit))
        if found is None:
            picked = candidates(
                self.kind, self.now, shape, "id, priority, scheduled_time", self.lock, limit
            )
            found = self._statements[shape, limit] = prepared(
                f"UPDATE scheduler_job SET {CLAIMED_SET.format(now=self.now)} "
                f"WHERE {self.where.format(picked=picked)} "
                f"RETURNING {RETURNED}, {self.now} AS claimed_now"
            )
        return found

    def raw(self, shape: ClaimShape, dialect: Dialect, limit: int | None = None) -> RawStatement:
        found = self._raw.get((shape, limit, dialect))
        if found is None:
            statement = raw_statement(self.statement(shape, limit), dialect)
            found = self._raw[shape, limit, dialect] = statement
        return found

    def claim(self, conn: Connection, shape: ClaimShape, params: dict[str, Any]) -> Claimed:
        # Through the driver itself (store/raw.py): the claim is on every job's way, and
        # SQLAlchemy's execution and result machinery around it cost about as much as the
        # database's executing it.
        limit = int(params["limit"]) if self.sized else None
        return fetch_claimed(conn, self.raw(shape, conn.dialect, limit), params)


def fetch_claimed(conn: Connection, statement: RawStatement, params: dict[str, Any]) -> Claimed:
    """Run a claiming ``statement`` (one that returns ``RETURNED``, then ``claimed_now``)
    through the driver itself; its rows decoded, each on its own."""
    dialect = conn.dialect
    fetched = fetch_on(conn, statement, params)
    return decode([_ClaimedRow.of(row, dialect) for row in fetched], params["token"])


class _ClaimedRow(NamedTuple):
    """A row as the claim statement returns it (``RETURNED``, then ``claimed_now``), its
    two timestamps read as :class:`KeptDateTime` reads them."""

    id: int
    job_id: str
    task_name: str
    queue: str
    priority: int
    attempts: int
    claims: int
    scheduled_time: datetime
    payload: Any
    content_type: str
    content_encoding: str
    headers: Any
    properties: Any
    job_type: Any
    schedule_spec: str | None
    resource: str | None
    revoke_requested: str | None
    claimed_now: datetime | None

    @classmethod
    def of(cls, row: Sequence[Any], dialect: Dialect) -> _ClaimedRow:
        values = list(row)
        values[_SCHEDULED] = _stamp(values[_SCHEDULED], dialect)
        values[_CLAIMED_NOW] = _stamp(values[_CLAIMED_NOW], dialect)
        return cls(*values)


def _stamp(value: Any, dialect: Dialect) -> Any:
    """The value read as a timestamp; as it is when it is none: :func:`to_claimed` then
    fails the row alone."""
    return _STAMP.process_result_value(value, dialect)


_STAMP = KeptDateTime()
_SCHEDULED = _ClaimedRow._fields.index("scheduled_time")
_CLAIMED_NOW = _ClaimedRow._fields.index("claimed_now")


def claim_params(
    node_id: str, token: str, queues: Sequence[str], limit: int, resource: str | None = None
) -> dict[str, Any]:
    return _params(node_id, token, queues, limit, resource)
