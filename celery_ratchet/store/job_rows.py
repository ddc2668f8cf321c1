"""How job rows are written and read: the statements, parameters and conversions the
store's concerns share."""

from __future__ import annotations

import contextlib
import functools
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    LargeBinary,
    bindparam,
    func,
    text,
    type_coerce,
)
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.sql.elements import BindParameter

from celery_ratchet.domain.job import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    ClaimedJob,
    JobStatus,
    JobSummary,
    JobType,
    NewJob,
    parse_status,
)
from celery_ratchet.domain.priority import clamped, effective_priority
from celery_ratchet.errors import (
    InvalidJob,
)
from celery_ratchet.store.db_clock import (
    db_now,
)
from celery_ratchet.store.db_errors import sqlstate_of
from celery_ratchet.store.dialect import dialect_for
from celery_ratchet.store.engine import (
    insert_ignoring_conflicts,
)
from celery_ratchet.store.schema import (
    ACTIVE_KEY_INDEX,
    ACTIVE_KEY_WHERE,
    ListedDateTime,
    UTCDateTime,
    scheduler_job,
)

job = scheduler_job
TERMINAL = [s.value for s in TERMINAL_STATUSES]
#: Jobs that ran to an end here, for throughput: a state stored from outside is not one.
RAN_TO_AN_END = [s for s in TERMINAL if s != JobStatus.EXTERNAL.value]
#: Listings and counts are of jobs: recurring masters are schedules (``list_masters``).
JOBS_ONLY = job.c.job_type != JobType.RECURRING.value
ACTIVE = [s.value for s in ACTIVE_STATUSES]
CANCELS_DOWNSTREAM = frozenset({JobStatus.FAILED.value, JobStatus.REVOKED.value})


class ClaimLost(Exception):
    """Rolls back a transaction whose compare-and-swap found the claim gone."""


#: ``revoke_requested`` of a revoke without terminate: drop the job if it has not started.
REVOKE_ONLY = "REVOKE"


def new_job_values() -> dict[str, Any]:
    """Column values of a freshly (re)scheduled job, all from bind parameters."""
    return {
        "task_name": bindparam("p_task_name"),
        "queue": bindparam("p_queue"),
        "status": JobStatus.PENDING.value,
        "job_type": bindparam("p_job_type"),
        "priority": bindparam("p_priority"),
        "scheduled_time": func.coalesce(bindparam("p_due", type_=UTCDateTime()), db_now()),
        "expires_at": bindparam("p_expires_at", type_=UTCDateTime()),
        "attempts": bindparam("p_attempts"),
        "claims": 0,
        "root_id": bindparam("p_root_id"),
        "parent_id": bindparam("p_parent_id"),
        "group_id": bindparam("p_group_id"),
        "payload": bindparam("p_payload"),
        "content_type": bindparam("p_content_type"),
        "content_encoding": bindparam("p_content_encoding"),
        "headers": bindparam("p_headers"),
        "properties": bindparam("p_properties"),
        "business_key": bindparam("p_business_key"),
        "schedule_spec": bindparam("p_schedule_spec"),
        "resource": bindparam("p_resource"),
        "tags": bindparam("p_tags"),
    }


#: What registering a recurring master again may change: its message and its schedule.
DEFINITION = (
    "task_name", "priority", "payload", "content_type", "content_encoding", "headers",
    "properties", "business_key", "schedule_spec",
)  # fmt: skip

#: Masters whose next due time one UPDATE sets: well within every dialect's bind limit.
MASTER_IDS_PER_UPDATE = 500
CLEARED_CLAIM = {"picked_by": None, "claim_token": None, "claimed_at": None, "started_at": None}
CLEARED_RESULT = {
    "revoke_requested": None,
    "finished_at": None,
    "job_result": None,
    "result_type": None,
    "result_meta": None,
    "last_error": None,
    "error_traceback": None,
}


_INSERTED = (
    "job_id, task_name, queue, status, job_type, priority, scheduled_time, created_at, "
    "expires_at, attempts, claims, root_id, parent_id, group_id, payload, content_type, "
    "content_encoding, headers, properties, business_key, schedule_spec, resource, tags"
)


_PARAM_NAMES = (
    "p_job_id", "p_task_name", "p_queue", "p_job_type", "p_priority", "p_due", "p_expires_at",
    "p_attempts", "p_root_id", "p_parent_id", "p_group_id", "p_payload", "p_content_type",
    "p_content_encoding", "p_headers", "p_properties", "p_business_key", "p_schedule_spec",
    "p_resource", "p_tags",
)  # fmt: skip
#: Rows per multi-row INSERT (MySQL): 8,000 parameters a statement.
BULK_ROWS = 500

#: What one pipelined executemany carries (psycopg): past a few hundred KB in flight, the
#: driver at times waits out its 0.1 s poll interval between writing rows and reading their
#: replies (a group of 1,000 took 250 ms instead of 50 in one round of two or three);
#: chunks of this size never did.
PIPELINE_ROWS = 100
PIPELINE_BYTES = 128 * 1024


def pipeline_chunks(params: Sequence[dict[str, Any]]) -> Iterator[Sequence[dict[str, Any]]]:
    """``params`` in executemany chunks of at most PIPELINE_ROWS rows and about
    PIPELINE_BYTES of row data each."""
    start, carried = 0, 0
    for index, row in enumerate(params):
        size = len(row["p_payload"]) + len(row["p_headers"]) + len(row["p_properties"])
        if index > start and (index - start >= PIPELINE_ROWS or carried + size > PIPELINE_BYTES):
            yield params[start:index]
            start, carried = index, 0
        carried += size
    if start < len(params):
        yield params[start:]


#: The enqueue INSERT's rows as PostgreSQL's COPY takes them (psycopg 3): a 1,000-row write
#: in about half the time of the pipelined INSERTs, in the same transaction.
COPY_JOBS = f"COPY scheduler_job ({_INSERTED}) FROM STDIN"


def copied_row(bound: Mapping[str, Any], now: datetime) -> tuple[Any, ...]:
    """One row of COPY_JOBS from the values the INSERT binds (``bound``, as the driver takes
    them), with what the INSERT computes given as it computes it: the status, the due time's
    default and ``created_at`` (``now``: the transaction's ``now()``), no claims yet."""
    due = bound["p_due"]
    return (
        bound["p_job_id"], bound["p_task_name"], bound["p_queue"], "PENDING",
        bound["p_job_type"], bound["p_priority"], now if due is None else due, now,
        bound["p_expires_at"], bound["p_attempts"], 0, bound["p_root_id"],
        bound["p_parent_id"], bound["p_group_id"], bound["p_payload"],
        bound["p_content_type"], bound["p_content_encoding"], bound["p_headers"],
        bound["p_properties"], bound["p_business_key"], bound["p_schedule_spec"],
        bound["p_resource"], bound["p_tags"],
    )  # fmt: skip


#: The due time of a chain step still waiting for the step before it (as in the seeds: a
#: sentinel no poll reaches; its WAITING status keeps it out of every claim anyway).
WAITING_DUE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)
WAITING_COLUMNS = frozenset(
    {"job_id", "task_name", "queue", "job_type", "priority", "root_id", "parent_id",
     "group_id", "payload", "content_type", "content_encoding", "headers", "properties",
     "depends_on"}
)  # fmt: skip


#: The PostgreSQL channel every insert of a job notifies, with its queue as the payload.
NOTIFY_CHANNEL = "ratchet_jobs"


@functools.lru_cache(maxsize=32)
def insert_statement(
    dialect: Any,
    rows: int = 1,
    ignore_existing: bool = False,
    notify: bool = False,
    keyed: bool = False,
) -> Any:
    """The enqueue INSERT as plain SQL, for ``rows`` rows at once: the hottest statement,
    with nothing to return and nothing to compile per call. ``ignore_existing`` skips rows
    whose job id is taken (recurring occurrences, which are unique per fire time).
    ``notify`` (PostgreSQL): each inserted row notifies its queue to listening workers, in
    the same statement (no extra round trip) and only once the row is committed.
    ``keyed`` (one row with a business key): PostgreSQL and SQLite insert nothing when an
    active job holds the key (the partial unique index is the arbiter; a taken job id still
    raises); MySQL has no such clause: its duplicate-key error names the index instead."""
    capable = dialect_for(dialect)
    now = capable.now()

    def suffix(i: int) -> str:
        return "" if rows == 1 else f"_{i}"

    values = ", ".join(
        f"(:p_job_id{suffix(i)}, :p_task_name{suffix(i)}, :p_queue{suffix(i)}, 'PENDING', "
        f":p_job_type{suffix(i)}, :p_priority{suffix(i)}, COALESCE(:p_due{suffix(i)}, {now}), "
        f"{now}, :p_expires_at{suffix(i)}, :p_attempts{suffix(i)}, 0, :p_root_id{suffix(i)}, "
        f":p_parent_id{suffix(i)}, :p_group_id{suffix(i)}, :p_payload{suffix(i)}, "
        f":p_content_type{suffix(i)}, :p_content_encoding{suffix(i)}, :p_headers{suffix(i)}, "
        f":p_properties{suffix(i)}, :p_business_key{suffix(i)}, :p_schedule_spec{suffix(i)}, "
        f":p_resource{suffix(i)}, :p_tags{suffix(i)})"
        for i in range(rows)
    )
    typed: list[BindParameter[Any]] = []
    for i in range(rows):
        typed += [
            bindparam(f"p_due{suffix(i)}", type_=UTCDateTime()),
            bindparam(f"p_expires_at{suffix(i)}", type_=UTCDateTime()),
            bindparam(f"p_payload{suffix(i)}", type_=LargeBinary()),
        ]
    insert_into, on_conflict = "INSERT INTO", ""
    if ignore_existing:
        # Only a taken job id is skipped; MySQL's INSERT IGNORE would also swallow errors
        # such as an id cut short to fit its column.
        insert_into, on_conflict = capable.insert_ignoring_taken_ids()
    if keyed and capable.inserts_skipping_held_keys:
        on_conflict = f" ON CONFLICT (business_key) WHERE {ACTIVE_KEY_WHERE} DO NOTHING"
    returning = ""
    if notify and capable.notifies:
        returning = f" RETURNING pg_notify('{NOTIFY_CHANNEL}', queue)"
    return text(
        f"{insert_into} scheduler_job ({_INSERTED}) VALUES {values}{on_conflict}{returning}"
    ).bindparams(*typed)


def bulk_params(params: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {f"{name}_{i}": p[name] for i, p in enumerate(params) for name in _PARAM_NAMES}


#: Tries to place a keyed job when the key's holder ends between the conflict and the look-up.
KEY_TRIES = 10


def is_active_key_conflict(exc: IntegrityError) -> bool:
    """Whether the unique index on active business keys refused the row (not a job id)."""
    orig = exc.orig
    diag = getattr(orig, "diag", None)
    if diag is not None:  # psycopg
        return getattr(diag, "constraint_name", None) == ACTIVE_KEY_INDEX
    text_ = str(orig)
    # MySQL/MariaDB name the index; SQLite names the indexed column.
    return ACTIVE_KEY_INDEX in text_ or "scheduler_job.business_key" in text_


def lacks_active_key_index(exc: DBAPIError) -> bool:
    """PostgreSQL and SQLite refuse an ON CONFLICT target that no unique index matches."""
    if sqlstate_of(exc.orig) == "42P10":  # invalid_column_reference
        return True
    return "does not match any PRIMARY KEY or UNIQUE constraint" in str(exc.orig)


def no_guard() -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


def claim_held(job_id: Any, token: Any) -> tuple[Any, ...]:
    """The compare-and-swap of every write made under a claim: this job, this claim, still
    running. A worker whose claim was taken away matches no row."""
    return (
        job.c.job_id == job_id,
        job.c.claim_token == token,
        job.c.status == JobStatus.RUNNING.value,
    )


#: Text fields of a job checked before any write: (name in messages, column).
_CHECKED_FIELDS = (
    ("task id", "job_id"), ("task name", "task_name"), ("queue", "queue"),
    ("root id", "root_id"), ("parent id", "parent_id"), ("group id", "group_id"),
    ("business key", "business_key"), ("resource", "resource"), ("depends on", "depends_on"),
)  # fmt: skip


#: Column sizes of those fields (None: unbounded text).
_LENGTHS: dict[str, int | None] = {
    c.name: getattr(c.type, "length", None) for c in scheduler_job.columns
}


_ID_LENGTH = min(_LENGTHS[column] or 0 for _, column in _CHECKED_FIELDS)


def check_fields(new: NewJob) -> None:
    """Refuse what the job store cannot hold as given, before anything is written: text
    longer than its column (MySQL in a lax sql_mode would cut it short, so the job would sit
    in a queue nobody consumes or under an id nobody asks for), NUL characters and lone
    surrogates (refused by PostgreSQL and MySQL). The message names the field and the limit,
    never the job's arguments."""
    m = new.message
    ids = (new.job_id, new.task_name, new.queue, new.root_id, new.parent_id, new.group_id,
           new.business_key, new.resource, new.depends_on)  # fmt: skip
    # The common case in one pass (this runs for every row of a bulk insert): short ASCII.
    present = [v for v in ids if v is not None]
    try:
        text = "".join([*present, m.content_type, m.content_encoding, *new.tags])
    except TypeError:
        text = "\x00"  # not all text: the checks below say which field
    if (
        "\x00" not in text
        and text.isascii()
        and max(map(len, present), default=0) <= _ID_LENGTH
        and len(m.content_type) <= _LENGTHS["content_type"]  # type: ignore[operator]
        and len(m.content_encoding) <= _LENGTHS["content_encoding"]  # type: ignore[operator]
    ):
        return
    values = [(label, column, getattr(new, column)) for label, column in _CHECKED_FIELDS]
    values += [
        ("content type", "content_type", new.message.content_type),
        ("content encoding", "content_encoding", new.message.content_encoding),
    ]
    values += [("tag", "tags", tag) for tag in new.tags]
    for label, column, value in values:
        if value is None:
            continue
        what = "a job" if label == "task name" else f"task {new.task_name[:80]!r}"
        if not isinstance(value, str):
            raise InvalidJob(label, f"{what}: the {label} must be text, got {type(value).__name__}")
        limit = _LENGTHS[column]
        if limit is not None and len(value) > limit:
            raise InvalidJob(
                label,
                f"{what}: the {label} is {len(value)} characters, over the limit of {limit} "
                f"(column scheduler_job.{column}); use a shorter {label}",
            )
        if "\x00" in value:
            raise InvalidJob(
                label,
                f"{what}: the {label} contains a NUL character (\\x00), which the job store "
                f"cannot hold; remove it",
            )
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidJob(
                label, f"{what}: the {label} is not valid Unicode text (a lone surrogate)"
            ) from None


def job_params(new: NewJob) -> dict[str, Any]:
    check_fields(new)
    m = new.message
    return {
        "p_job_id": new.job_id,
        "p_task_name": new.task_name,
        "p_queue": new.queue,
        "p_job_type": new.job_type.value,
        # Kept to 0-9 whatever the caller built: the claim reads levels 0-9 one by one.
        "p_priority": clamped(new.priority),
        "p_due": new.due,
        "p_expires_at": new.expires_at,
        "p_attempts": new.attempts,
        "p_root_id": new.root_id,
        "p_parent_id": new.parent_id,
        "p_group_id": new.group_id,
        "p_payload": m.payload,
        "p_content_type": m.content_type,
        "p_content_encoding": m.content_encoding,
        "p_headers": m.headers,
        "p_properties": m.properties,
        "p_business_key": new.business_key,
        "p_schedule_spec": new.schedule_spec,
        "p_resource": new.resource,
        "p_tags": tags_text(new.tags),
        "p_depends_on": new.depends_on,
    }


def best_first(claimed: list[ClaimedJob], boost_minutes: float) -> list[ClaimedJob]:
    """Dispatch order of one claimed batch: the claim's own order."""

    def key(j: ClaimedJob) -> tuple[int, datetime, int]:
        now = j.claimed_now or j.scheduled_time
        return (-effective_priority(j.priority, j.scheduled_time, now, boost_minutes),
                j.scheduled_time, j.id)  # fmt: skip

    return sorted(claimed, key=key)


def insert_ignoring_duplicates(dialect: Any, table: Any, values: dict[str, Any]) -> Any:
    """INSERT of a row that may exist already (then nothing happens), in one statement."""
    return insert_ignoring_conflicts(dialect, table).values(**values, updated_at=db_now())


def tags_text(tags: Sequence[str]) -> str | None:
    """Tags as stored: ``,a,b,`` (commas inside a tag are not allowed)."""
    if not tags:
        return None
    for tag in tags:
        if "," in tag or not tag:
            raise ValueError(f"tag {tag!r}: tags are non-empty and contain no comma")
    return "," + ",".join(tags) + ","


def storable(text: str | None) -> str | None:
    """Text every database accepts: no NUL characters, no lone surrogates."""
    if text is None:
        return None
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def group_by_outcome(params: list[dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    grouped: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for p in params:
        grouped[p["p_status"]].append((p["p_job_id"], p["p_token"]))
    return grouped


def settled_values(status: JobStatus) -> dict[str, Any]:
    if status is JobStatus.PENDING:  # handed back: due again at once, for any node
        return {"status": status.value, **CLEARED_CLAIM}
    return {"status": status.value, "finished_at": db_now()}


def as_bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def listed_column(column: Any) -> Any:
    """A timestamp column as a listing reads it: one unreadable value is not a failed list."""
    return type_coerce(column, ListedDateTime()).label(column.name)


def job_summary(row: Any) -> JobSummary:
    values = row._asdict()
    values["status"] = parse_status(values["status"])
    return JobSummary(**values)
