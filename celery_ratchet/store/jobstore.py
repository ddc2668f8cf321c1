"""The job store: every read and write of job rows, as named operations.

Every completion is a compare-and-swap on (job id, claim token, status RUNNING): a worker whose
claim was taken away (orphan recovery, a retry that rescheduled the row) can never overwrite it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

from sqlalchemy import (
    LargeBinary,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    inspect,
    or_,
    select,
    text,
    tuple_,
    type_coerce,
    update,
)
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.sql.elements import BindParameter

from celery_ratchet.domain.batch import BatchPart
from celery_ratchet.domain.dlq_alert import AlertWindow
from celery_ratchet.domain.job import (
    ACTIVE_STATUSES,
    REVOCATIONS_WAKEUP,
    SCHEDULES_QUEUE,
    TERMINAL_STATUSES,
    ClaimedJob,
    JobStatus,
    JobSummary,
    JobType,
    NewJob,
    OnDuplicate,
    ResultRecord,
    Settlement,
    error_record,
    parse_status,
)
from celery_ratchet.domain.priority import DEFAULT_BOOST_MINUTES, clamped, effective_priority
from celery_ratchet.errors import (
    ConfigurationError,
    DuplicateJob,
    InvalidJob,
    RatchetError,
    SchemaMissing,
    SchemaOutdated,
    StoreBusy,
    StoreUnavailable,
)
from celery_ratchet.store import dlq_alerts
from celery_ratchet.store.batches import (
    cancel_downstream,
    record_ended_parts,
    record_part,
    restore_downstream,
)
from celery_ratchet.store.claim import (
    RETURNED,
    Claimed,
    ClaimShape,
    MalformedRow,
    claim_params,
    decode,
    strategy_for,
)
from celery_ratchet.store.ddl import bring_up_to_date, schema_differences
from celery_ratchet.store.engine import (
    EngineOptions,
    db_now,
    db_now_minus,
    engine_for,
    family,
    insert_ignoring_conflicts,
    is_missing_table,
    is_prepared_statement_conflict,
    is_retryable_conflict,
    is_unavailable,
    prepared_statement_conflict,
    refused,
    same_database,
    savepoint,
    transaction,
    unavailable,
)
from celery_ratchet.store.raw import execute as execute_raw
from celery_ratchet.store.raw import pooled, raw_statement
from celery_ratchet.store.redact import mask_url
from celery_ratchet.store.schema import (
    ACTIVE_KEY_INDEX,
    ACTIVE_KEY_WHERE,
    MYSQL_ACTIVE_KEY_COLUMN,
    ListedDateTime,
    UTCDateTime,
    metadata,
    scheduler_group_result,
    scheduler_job,
    scheduler_job_archive,
    scheduler_job_log,
    scheduler_node,
    scheduler_resource,
    scheduler_resource_permit,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
job = scheduler_job
_TERMINAL = [s.value for s in TERMINAL_STATUSES]
#: Listings and counts are of jobs: recurring masters are schedules (``list_masters``).
_JOBS_ONLY = job.c.job_type != JobType.RECURRING.value
_ACTIVE = [s.value for s in ACTIVE_STATUSES]
_CANCELS_DOWNSTREAM = frozenset({JobStatus.FAILED.value, JobStatus.REVOKED.value})


@dataclass(frozen=True)
class OrphanRecovery:
    """What one orphan scan took back from dead nodes."""

    #: Jobs due again (PENDING).
    requeued: list[str]
    #: Jobs past ``ratchet_max_recoveries``: FAILED, in the dead-letter queue.
    dead_lettered: list[str]
    #: The nodes declared dead (their rows deleted).
    dead_nodes: list[str]

    @property
    def jobs(self) -> list[str]:
        return sorted(self.requeued + self.dead_lettered)


def recovery_limit_record(claims: int, limit: int) -> str:
    """The error of a job dead-lettered by orphan recovery, as Celery stores exceptions."""
    message = (
        f"this job was taken back from a node that died or was declared dead while holding "
        f"it, after {claims} claims that never finished (more than ratchet_max_recoveries = "
        f"{limit}), so it is not run again: its task may crash or stall its worker (killed, "
        "out of memory, os._exit, a long call holding the GIL under -P threads). Fix the "
        "task, then requeue the job from the dead-letter queue (`ratchet dlq retry <job id>`"
        " or celery_ratchet.dlq(app).retry(job_id)); or raise ratchet_max_recoveries"
    )
    return error_record("RecoveryLimitExceeded", [message], "celery_ratchet.errors")


class Reachability:
    """Logs the job store going away once, and its return once, per process: not one line
    per failed statement. Processes whose outages another process reports (a worker's pool
    processes, reported by the worker) log them at DEBUG only (:func:`quiet_outages`)."""

    #: Level of the two lines; DEBUG where another process of the same worker logs them.
    level = logging.WARNING

    def __init__(self, display_url: str) -> None:
        self.display_url = display_url
        self._lock = threading.Lock()
        self._down_since: float | None = None

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            if self._down_since is not None:
                return
            self._down_since = time.monotonic()
        logger.log(self.level, "ratchet: the job store is unreachable: %s", exc)

    def succeeded(self) -> None:
        if self._down_since is None:  # read without the lock: the common case stays cheap
            return
        with self._lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            logger.log(
                self.level,
                "ratchet: the job store at %s is reachable again after %.1fs",
                self.display_url,
                time.monotonic() - since,
            )


def quiet_outages() -> None:
    """In this process, log the job store's outages at DEBUG: another process (the worker's
    main process) reports them."""
    Reachability.level = logging.DEBUG


class _ClaimLost(Exception):
    """Rolls back a transaction whose compare-and-swap found the claim gone."""


_CONFLICT_RETRIES = 5
#: ``revoke_requested`` of a revoke without terminate: drop the job if it has not started.
REVOKE_ONLY = "REVOKE"


def _new_job_values() -> dict[str, Any]:
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
_DEFINITION = (
    "task_name", "priority", "payload", "content_type", "content_encoding", "headers",
    "properties", "business_key", "schedule_spec",
)  # fmt: skip

#: Masters whose next due time one UPDATE sets: well within every dialect's bind limit.
_MASTER_IDS_PER_UPDATE = 500
_CLEARED_CLAIM = {"picked_by": None, "claim_token": None, "claimed_at": None, "started_at": None}
_CLEARED_RESULT = {
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

#: The due time of a chain step still waiting for the step before it (as in the seeds: a
#: sentinel no poll reaches; its WAITING status keeps it out of every claim anyway).
WAITING_DUE = datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone.utc)
_WAITING_COLUMNS = frozenset(
    {"job_id", "task_name", "queue", "job_type", "priority", "root_id", "parent_id",
     "group_id", "payload", "content_type", "content_encoding", "headers", "properties",
     "depends_on"}
)  # fmt: skip


#: The PostgreSQL channel every insert of a job notifies, with its queue as the payload.
NOTIFY_CHANNEL = "ratchet_jobs"


@functools.lru_cache(maxsize=32)
def _insert_statement(
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
    now = str(db_now().compile(dialect=dialect))

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
        insert_into, on_conflict = {
            "postgresql": ("INSERT INTO", " ON CONFLICT (job_id) DO NOTHING"),
            "sqlite": ("INSERT OR IGNORE INTO", ""),
        }.get(dialect.name, ("INSERT INTO", " ON DUPLICATE KEY UPDATE job_id = job_id"))
    if keyed and dialect.name in ("postgresql", "sqlite"):
        on_conflict = f" ON CONFLICT (business_key) WHERE {ACTIVE_KEY_WHERE} DO NOTHING"
    returning = ""
    if notify and dialect.name == "postgresql":
        returning = f" RETURNING pg_notify('{NOTIFY_CHANNEL}', queue)"
    return text(
        f"{insert_into} scheduler_job ({_INSERTED}) VALUES {values}{on_conflict}{returning}"
    ).bindparams(*typed)


def _bulk_params(params: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {f"{name}_{i}": p[name] for i, p in enumerate(params) for name in _PARAM_NAMES}


#: Tries to place a keyed job when the key's holder ends between the conflict and the look-up.
_KEY_TRIES = 10


def _is_active_key_conflict(exc: IntegrityError) -> bool:
    """Whether the unique index on active business keys refused the row (not a job id)."""
    orig = exc.orig
    diag = getattr(orig, "diag", None)
    if diag is not None:  # psycopg
        return getattr(diag, "constraint_name", None) == ACTIVE_KEY_INDEX
    text_ = str(orig)
    # MySQL/MariaDB name the index; SQLite names the indexed column.
    return ACTIVE_KEY_INDEX in text_ or "scheduler_job.business_key" in text_


def _lacks_active_key_index(exc: DBAPIError) -> bool:
    """PostgreSQL and SQLite refuse an ON CONFLICT target that no unique index matches."""
    if getattr(exc.orig, "sqlstate", None) == "42P10":  # invalid_column_reference
        return True
    return "does not match any PRIMARY KEY or UNIQUE constraint" in str(exc.orig)


def _no_guard() -> contextlib.AbstractContextManager[Any]:
    return contextlib.nullcontext()


def _held(job_id: Any, token: Any) -> tuple[Any, ...]:
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


def _params(new: NewJob) -> dict[str, Any]:
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


@dataclass(frozen=True)
class _Taken:
    """A plain insert found its job id taken; ``maybe_ours``: by a try of its own."""

    maybe_ours: bool


class JobStore:
    """Job rows in one database. Thread-safe; one instance per URL per process is enough."""

    def __init__(
        self,
        url: str,
        *,
        create_schema: bool = True,
        engine: Engine | None = None,
        priority_boost_minutes: float = DEFAULT_BOOST_MINUTES,
        notify: bool = False,
        engine_options: EngineOptions | None = None,
        dlq_alert_task: str | None = None,
    ):
        self.url = url
        #: The task sent dead-letter alerts: with one, each job failing for good is counted
        #: into its task name's alert window, in the transaction that fails it.
        self.dlq_alert_task = dlq_alert_task
        #: Aging: a waiting job gains one priority level per this many minutes (0: never).
        self.priority_boost_minutes = max(float(priority_boost_minutes), 0.0)
        self.display_url = mask_url(url)
        #: Whether the database answers, as this process last found it.
        self.reachability = Reachability(self.display_url)
        self.engine = engine or engine_for(url, engine_options)
        self.family = family(self.engine.dialect.name)
        self._claim = strategy_for(self.engine.dialect)
        self._create_schema = create_schema
        self._schema_ready = False
        #: PostgreSQL: inserts notify listening workers (LISTEN/NOTIFY wake-ups).
        self.notify = notify and self.family == "postgresql"
        self._insert = _insert_statement(self.engine.dialect, notify=self.notify)
        self._raw_insert = raw_statement(self._insert, self.engine.dialect)
        self._insert_keyed_row = _insert_statement(
            self.engine.dialect, notify=self.notify, keyed=True
        )
        if self.family == "mysql":
            # A locking read sees the latest committed row, even inside a caller's
            # REPEATABLE READ transaction whose snapshot predates the holder.
            self._key_holder = text(
                f"SELECT job_id FROM scheduler_job WHERE {MYSQL_ACTIVE_KEY_COLUMN} = :key "
                "LOCK IN SHARE MODE"
            )
            self._committed_key_holder = text(
                f"SELECT job_id FROM scheduler_job WHERE {MYSQL_ACTIVE_KEY_COLUMN} = :key"
            )
        else:
            self._key_holder = text(
                f"SELECT job_id FROM scheduler_job WHERE business_key = :key AND {ACTIVE_KEY_WHERE}"
            )
            self._committed_key_holder = self._key_holder
        released = _new_job_values()
        released.pop("group_id")  # a step keeps the group its signature was frozen with
        # A chain step stored ahead holds no business key (see waiting_steps): releasing it
        # gives it none, so the release never meets the unique index on active keys.
        released.pop("business_key")
        self._release_waiting_silently = (
            update(job)
            .where(job.c.job_id == bindparam("p_job_id"), job.c.status == JobStatus.WAITING.value)
            .values(**released, created_at=db_now())
        )
        self._release_waiting = self._release_waiting_silently
        if self.notify:
            self._release_waiting = self._release_waiting.returning(
                func.pg_notify(NOTIFY_CHANNEL, job.c.queue)
            )
        self._select_claimed = text(
            f"SELECT {RETURNED} FROM scheduler_job "
            "WHERE claim_token = :token AND status = 'RUNNING'"
        ).columns(scheduled_time=UTCDateTime())
        rescheduled = _new_job_values()
        # A retry or replace is the same job: it keeps its business key (and stays active).
        rescheduled.pop("business_key")
        self._replace_running = (
            update(job)
            .where(*_held(bindparam("p_job_id"), bindparam("p_token")))
            .values(**rescheduled, **_CLEARED_CLAIM)
        )
        owned = _held(bindparam("p_job_id"), bindparam("p_token"))
        finished = {"status": bindparam("p_status"), "finished_at": db_now()}
        self._store_outcome = (
            update(job)
            .where(*owned)
            .values(
                **finished,
                job_result=bindparam("p_job_result"),
                result_type=bindparam("p_result_type"),
                result_meta=bindparam("p_result_meta"),
                last_error=bindparam("p_error"),
                error_traceback=bindparam("p_traceback"),
            )
        )
        handed_back = bindparam("p_status") == JobStatus.PENDING.value
        cleared = {k: case((handed_back, None), else_=job.c[k]) for k in _CLEARED_CLAIM}
        self._settle_one = (
            update(job)
            .where(*owned)
            .values(
                status=bindparam("p_status"),
                finished_at=case((handed_back, None), else_=db_now()),
                last_error=func.coalesce(bindparam("p_error"), job.c.last_error),
                error_traceback=func.coalesce(bindparam("p_traceback"), job.c.error_traceback),
                **cleared,
            )
        )
        permit = scheduler_resource_permit
        self._known_resources: set[str] = set()
        self._count_permits = (
            select(func.count())
            .select_from(permit)
            .where(permit.c.resource == bindparam("resource"))
        )
        still_running = (
            select(job.c.id)
            .where(
                job.c.job_id == permit.c.job_id,
                job.c.claim_token == permit.c.claim_token,
                job.c.status == JobStatus.RUNNING.value,
            )
            .correlate(permit)
        )
        self._drop_stale_permits = delete(permit).where(
            permit.c.resource == bindparam("resource"), ~still_running.exists()
        )
        self._replace_running_silently = self._replace_running
        if self.notify:
            # A retry is due again (now or after its countdown): idle workers sleep until
            # the next due time they know of, so they are told.
            self._replace_running = self._replace_running.returning(
                func.pg_notify(NOTIFY_CHANNEL, job.c.queue)
            )
        self._reuse_finished = (
            update(job)
            .where(job.c.job_id == bindparam("p_job_id"), job.c.status.in_(_TERMINAL))
            .values(**_new_job_values(), **_CLEARED_CLAIM, **_CLEARED_RESULT, created_at=db_now())
        )

    def stop_notifying(self) -> None:
        """No more ``pg_notify`` on inserts: nothing receives them (see ``send_probe``)."""
        self.notify = False
        self._insert = _insert_statement(self.engine.dialect, notify=False)
        self._raw_insert = raw_statement(self._insert, self.engine.dialect)
        self._insert_keyed_row = _insert_statement(self.engine.dialect, keyed=True)
        self._release_waiting = self._release_waiting_silently
        self._replace_running = self._replace_running_silently

    def send_probe(self, payload: str) -> None:
        """NOTIFY the wake-up channel through the store's own connections, the way inserts
        do: a listener that never receives it listens where enqueues do not notify."""
        statement = select(func.pg_notify(NOTIFY_CHANNEL, bindparam("payload")))
        self._attempt(
            lambda conn: conn.execute(statement, {"payload": payload}),
            "the wake-up probe was not sent",
        )

    # -- plumbing ---------------------------------------------------------------------------

    def _run(self, work: Callable[[Connection], T], what: str) -> T:
        self.ensure_schema()
        return self._attempt(work, what)

    def _attempt(
        self, work: Callable[[Any], T], what: str, connect: Callable[[], Any] | None = None
    ) -> T:
        """Run ``work`` on a pooled connection: once more after a dropped connection, a few
        more times after a deadlock; :class:`StoreUnavailable` when the database is gone.
        ``connect``: where the connection comes from (default: a SQLAlchemy Connection)."""
        try:
            done = self._attempt_once(work, what, connect or self.engine.connect)
        except StoreUnavailable as exc:
            self.reachability.failed(exc)
            raise
        self.reachability.succeeded()
        return done

    def _attempt_once(self, work: Callable[[Any], T], what: str, connect: Callable[[], Any]) -> T:
        reconnected = False
        conflicts = 0
        #: A statement went out before the connection was lost: it may have been committed.
        maybe_sent = False
        while True:
            connected = False
            try:
                with connect() as conn:
                    connected = True
                    return work(conn)
            except DBAPIError as exc:
                if is_prepared_statement_conflict(exc):
                    raise prepared_statement_conflict(exc, what) from exc
                if is_retryable_conflict(exc):
                    if conflicts >= _CONFLICT_RETRIES:
                        raise StoreBusy(
                            f"the job store kept refusing for lock conflicts ({exc.orig}); {what}"
                        ) from exc
                    conflicts += 1
                    time.sleep(0.005 * conflicts)
                    continue
                if is_unavailable(exc):
                    maybe_sent = maybe_sent or connected
                    if exc.connection_invalidated and not reconnected:
                        reconnected = True
                        continue
                    raise unavailable(self.url, exc, what, sent=maybe_sent) from exc
                if isinstance(exc, DataError):
                    raise refused(exc, what) from exc
                if is_missing_table(exc):
                    raise SchemaMissing(
                        f"the job store at {self.display_url} has no ratchet tables (or not all "
                        f"of them); create them with `ratchet --url URL schema apply`, or start "
                        f"a worker once; {what}"
                    ) from exc
                raise
            except Exception as exc:
                if is_unavailable(exc):
                    maybe_sent = maybe_sent or connected
                    raise unavailable(self.url, exc, what, sent=maybe_sent) from exc
                raise

    def ensure_schema(self) -> None:
        if self._schema_ready or not self._create_schema:
            return
        # At start-up, active jobs of an earlier version sharing a business key do not keep
        # this process from running: the unique index waits for a later start (a warning).
        created = self._attempt(
            lambda conn: bring_up_to_date(conn, wait_for_unique_keys=True),
            "the schema was not created",
        )
        self._schema_ready = True
        if created:
            logger.info("ratchet: created or brought up to date: %s", ", ".join(created))

    def create_missing_tables(self) -> list[str]:
        return self._attempt(self._create_tables, "the schema was not created")

    def schema_differences(self) -> list[str]:
        """What the live database lacks of the schema: tables, columns, indexes."""
        return self._attempt(schema_differences, "the schema was not checked")

    def _create_tables(self, conn: Connection) -> list[str]:
        # Serialized by the database's schema lock: processes starting together on an empty
        # database create one schema, and none of them sees another's half-made tables.
        return bring_up_to_date(conn)

    # -- enqueue ----------------------------------------------------------------------------

    def enqueue(self, new: NewJob, *, maybe_committed: bool = False) -> dict[str, str]:
        """Insert one job; a finished job with the same id is replaced, an active one is not.
        Returns what :meth:`enqueue_many` does."""
        return self.enqueue_many([new], maybe_committed=maybe_committed)

    def enqueue_many(
        self,
        jobs: Sequence[NewJob],
        waiting: Sequence[NewJob] = (),
        *,
        maybe_committed: bool = False,
    ) -> dict[str, str]:
        """Insert jobs with multi-row INSERTs in one transaction: all or nothing.

        ``waiting`` are chain steps stored ahead of time (WAITING, never claimed); one whose id
        exists already is left alone. A job whose id is such a waiting step releases it.

        A job whose business key an active job holds is not inserted; the result maps its
        id to the holder's (``on_duplicate`` RAISE, or the head of a chain: DuplicateJob,
        and nothing is written). Jobs without a key take the plain multi-row path.

        ``maybe_committed``: an earlier call with these jobs failed in a way that may have
        committed them (a lost reply). A row holding the same id and message is then ours:
        success, whatever its state; a finished one is not run again."""
        if not jobs and not waiting:
            return {}
        params = [_params(j) for j in jobs]
        keyed = any(j.business_key is not None for j in jobs)
        heads = {w.depends_on for w in waiting}
        tries = 0
        if len(params) == 1 and not keyed and not waiting and params[0]["p_parent_id"] is None:
            # The common send: one plain row, no chain step to release. A taken id (or a try
            # that may have committed already) goes on to the full path below, which decides.
            taken = self._insert_plain(params[0], "no job was enqueued")
            if taken is None:
                return {}
            tries = 1 if taken.maybe_ours else 0

        def work(conn: Connection) -> dict[str, str]:
            nonlocal tries
            tries += 1
            # After a broken connection the earlier try may have committed: finding our own
            # row then is success, not a duplicate.
            retried = maybe_committed or tries > 1
            # Sent from inside a task: most likely the next step of a chain, stored as WAITING
            # with the rest of its chain at submission. Releasing it is all there is to do.
            from_a_task = len(params) == 1 and params[0]["p_parent_id"] is not None
            if from_a_task and conn.execute(self._release_waiting, params[0]).rowcount == 1:
                return {}
            if keyed and len(params) == 1 and not waiting:
                # Autocommit: one statement, nothing to roll back to.
                return self._insert_each(conn, jobs, params, retried, _no_guard, heads)
            if waiting or keyed:
                with transaction(conn):
                    self._insert_waiting(conn, waiting)
                    return self._insert_each(
                        conn, jobs, params, retried, lambda: savepoint(conn), heads
                    )
            if len(params) == 1:
                try:
                    conn.execute(self._insert, params[0])
                except IntegrityError:
                    self._reuse_or_refuse(conn, params[0], retried, _no_guard)
                return {}
            try:
                with transaction(conn):
                    self._insert_many(conn, params)
                return {}
            except IntegrityError:
                pass
            # An id already taken: one row at a time, still all or nothing.
            with transaction(conn):
                return self._insert_each(conn, jobs, params, retried, lambda: savepoint(conn))

        return self._run(work, "no job was enqueued")

    def _insert_plain(self, params: dict[str, Any], what: str) -> _Taken | None:
        """Insert one row through the driver itself (see store/raw.py): None when inserted,
        else its job id is taken (an active job, a finished one to re-arm, or this very row
        from a try whose reply was lost). Errors are translated as any write's are."""
        tries = 0

        def work(connection: Any) -> _Taken | None:
            nonlocal tries
            tries += 1
            try:
                execute_raw(self.engine, connection, self._raw_insert, params)
            except IntegrityError:
                # A try before this one lost its connection: the row may be its own.
                return _Taken(maybe_ours=tries > 1)
            return None

        self.ensure_schema()
        return self._attempt(work, what, lambda: pooled(self.engine))

    def enqueue_with(
        self,
        jobs: Sequence[NewJob],
        waiting: Sequence[NewJob],
        also: Callable[[Connection], None],
        what: str,
    ) -> None:
        """Insert jobs (multi-row) and run ``also`` on the same transaction: both or neither.
        A chunk of a streaming batch and the batch's counter and lease are written so. The
        jobs are a batch's children, which the batch counts itself: a business key an active
        job holds raises :class:`DuplicateJob` and nothing of the chunk is written."""
        params = [_params(j) for j in jobs]
        keyed = any(j.business_key is not None for j in jobs)
        tries = 0

        def work(conn: Connection) -> None:
            nonlocal tries
            tries += 1
            # A try before may have lost its reply after committing: our own rows are found.
            retried = tries > 1
            with transaction(conn):
                if waiting:
                    self._insert_waiting(conn, waiting)
                held: dict[str, str] = {}
                if keyed:
                    held = self._insert_each(conn, jobs, params, retried, lambda: savepoint(conn))
                else:
                    try:
                        with savepoint(conn):
                            self._insert_many(conn, params)
                    except IntegrityError:
                        held = self._insert_each(
                            conn, jobs, params, retried, lambda: savepoint(conn)
                        )
                if held:
                    holder = next(iter(held.values()))
                    raise DuplicateJob(
                        holder,
                        business_key="held",
                        reason="a streaming batch counts its own children, so none can stand "
                        "in for another job: give its children no business key, or keys no "
                        "active job holds",
                    )
                also(conn)

        self._run(work, what)

    def _insert_each(
        self,
        conn: Connection,
        jobs: Sequence[NewJob],
        params: list[dict[str, Any]],
        retried: bool,
        guard: Callable[[], contextlib.AbstractContextManager[Any]],
        heads: set[str | None] | None = None,
        within: bool = False,
    ) -> dict[str, str]:
        """One row at a time, each under ``guard`` (a savepoint in a transaction); returns
        the ids of jobs whose business key was held, mapped to the holders'. ``within``:
        ``conn`` is in the caller's own transaction."""
        held: dict[str, str] = {}
        for new, p in zip(jobs, params, strict=True):
            if new.business_key is not None:
                holder = self._committed_holder(p) if within and self.family != "sqlite" else None
                if holder is None:
                    holder = self._insert_keyed(conn, p, retried, guard, within=within)
            else:
                try:
                    with guard():
                        conn.execute(self._insert, p)
                    continue
                except IntegrityError:
                    holder = self._reuse_or_refuse(conn, p, retried, guard)
            if holder is None:
                continue
            if new.job_id in (heads or ()):
                raise DuplicateJob(
                    holder,
                    business_key=new.business_key,
                    reason="a chain cannot follow a job that is not its first step: "
                    "send the chain again once that job has ended",
                )
            if new.on_duplicate is OnDuplicate.RAISE:
                raise DuplicateJob(holder, business_key=new.business_key)
            held[new.job_id] = holder
        return held

    def _insert_keyed(
        self,
        conn: Connection,
        params: dict[str, Any],
        retried: bool,
        guard: Callable[[], contextlib.AbstractContextManager[Any]],
        within: bool = False,
    ) -> str | None:
        """Insert a job with a business key unless an active job holds the key: the
        database's unique index decides, so concurrent sends of a key make one job. None
        when the row is in (inserted, or ours from an earlier try), else the holder's id."""
        for _ in range(_KEY_TRIES):
            try:
                with guard():
                    inserted = conn.execute(self._insert_keyed_row, params).rowcount == 1
            except IntegrityError as exc:
                if not _is_active_key_conflict(exc):  # the job id is taken
                    return self._reuse_or_refuse(conn, params, retried, guard)
                inserted = False
            except DBAPIError as exc:
                if within and getattr(exc.orig, "sqlstate", None) == "40001":
                    # PostgreSQL, a REPEATABLE READ or SERIALIZABLE caller: the holder was
                    # committed after the caller's snapshot, which cannot see it.
                    holder = self._committed_holder(params)
                    if holder is not None:
                        return holder
                    raise StoreBusy(
                        f"the business key of job {params['p_job_id']!r} is held by a job "
                        "the caller's transaction cannot see (its snapshot is older); no "
                        "job was enqueued, send it again in a new transaction"
                    ) from exc
                if _lacks_active_key_index(exc):
                    raise SchemaOutdated(
                        f"the job store at {self.display_url} lacks the unique index "
                        f"{ACTIVE_KEY_INDEX} on active business keys (its schema predates "
                        "this version and was not brought up to date, or active jobs of an "
                        "earlier version share a key); run `ratchet --url URL schema apply`, "
                        "which says what stands in the way; no job was enqueued"
                    ) from exc
                raise
            if inserted:
                return None
            holder = self._holder_of(conn, params["p_business_key"])
            if holder == params["p_job_id"]:
                return None  # this very job: sent before, still active
            if holder is not None:
                return holder
            # The holder ended between the conflict and the look-up: the key is free now.
        raise StoreBusy(
            f"the business key of job {params['p_job_id']!r} kept changing hands "
            f"({_KEY_TRIES} tries); no job was enqueued"
        )

    def _committed_holder(self, params: dict[str, Any]) -> str | None:
        """The committed active job holding the key, other than this job, read on the store's
        own connection. MySQL: a caller's transaction that met the key through the unique
        index (or a locking read) would hold a lock on the holder's row until it ends, and
        the holder's worker could not record its outcome meanwhile. PostgreSQL: a REPEATABLE
        READ caller's insert would fail to serialize against a holder its snapshot lacks."""
        with self.engine.connect() as own:
            holder = own.execute(self._committed_key_holder, {"key": params["p_business_key"]})
            found = holder.scalar()
        return None if found is None or found == params["p_job_id"] else str(found)

    def _holder_of(self, conn: Connection, business_key: str) -> str | None:
        holder = conn.execute(self._key_holder, {"key": business_key}).scalar()
        return None if holder is None else str(holder)

    def _insert_waiting(self, conn: Connection, steps: Sequence[NewJob]) -> None:
        if not steps:
            return
        rows = [
            {**{k[2:]: v for k, v in _params(s).items() if k[2:] in _WAITING_COLUMNS},
             "status": JobStatus.WAITING.value, "scheduled_time": WAITING_DUE,
             "created_at": datetime.now(timezone.utc), "attempts": 0, "claims": 0}
            for s in steps
        ]  # fmt: skip
        conn.execute(insert_ignoring_conflicts(conn.dialect, job, key="job_id"), rows)

    def enqueue_within(
        self, conn: Connection, jobs: Sequence[NewJob], waiting: Sequence[NewJob] = ()
    ) -> dict[str, str]:
        """Insert jobs on the caller's own connection, inside the caller's transaction: they
        exist if and only if that transaction commits. A taken task id raises DuplicateJob
        without spoiling the caller's transaction (a savepoint holds each try); a business
        key held by an active job is as in :meth:`enqueue_many`."""
        if not jobs:
            return {}
        self._check_same_database(conn)
        if not self._schema_ready:
            # DDL cannot run inside the caller's transaction (MySQL would commit it, SQLite
            # would wait on its own lock): the tables must exist already.
            missing = set(metadata.tables) - set(inspect(conn).get_table_names())
            if missing:
                raise ConfigurationError(
                    f"the job store's tables do not exist yet ({', '.join(sorted(missing))}); "
                    "create them before enqueueing in your own transaction: "
                    "`ratchet --url URL schema apply`, or start a worker once"
                )
            self._schema_ready = True
        params = [_params(j) for j in jobs]
        keyed = any(j.business_key is not None for j in jobs)
        with conn.begin_nested():
            self._insert_waiting(conn, waiting)
            if not keyed:
                try:
                    with conn.begin_nested():
                        self._insert_many(conn, params)
                    return {}
                except IntegrityError:
                    pass
            heads = {w.depends_on for w in waiting}
            return self._insert_each(
                conn, jobs, params, False, conn.begin_nested, heads, within=True
            )

    def _check_same_database(self, conn: Connection) -> None:
        theirs = conn.engine.url
        if not same_database(self.engine.url, theirs):
            shown = mask_url(theirs.render_as_string(hide_password=False))
            described = conn.info.get("ratchet_described_as", "this connection")
            remedy = conn.info.get(
                "ratchet_remedy", "give a connection to that database, or send outside the block"
            )
            raise ConfigurationError(
                f"transactional enqueue needs the job store's database: {described} is to "
                f"{shown}, ratchet_url is {self.display_url}; {remedy}"
            )

    def _insert_many(
        self,
        conn: Connection,
        params: list[dict[str, Any]],
        *,
        ignore_existing: bool = False,
    ) -> None:
        # Measured per 1,000 rows: psycopg and sqlite3 pipeline executemany (25k and 60k
        # rows/s); PyMySQL sends it row by row (4.5k/s) but multi-row VALUES reach 15k/s.
        if self.family != "mysql":
            statement = (
                _insert_statement(conn.dialect, 1, True, self.notify)
                if ignore_existing
                else self._insert
            )
            conn.execute(statement, params)
            return
        for start in range(0, len(params), BULK_ROWS):
            chunk = params[start : start + BULK_ROWS]
            statement = _insert_statement(conn.dialect, len(chunk), ignore_existing)
            conn.execute(statement, chunk[0] if len(chunk) == 1 else _bulk_params(chunk))

    def _reuse_or_refuse(
        self,
        conn: Connection,
        params: dict[str, Any],
        retried: bool,
        guard: Callable[[], contextlib.AbstractContextManager[Any]],
    ) -> str | None:
        """The job id is taken: release the waiting step of that id, or re-arm the finished
        job of that id, or raise DuplicateJob. Returns the holder's id when re-arming met
        the job's business key held by another active job (then nothing was written)."""
        if conn.execute(self._release_waiting, params).rowcount == 1:
            return None
        if params["p_parent_id"] is not None:
            depends_on = conn.execute(
                select(job.c.depends_on).where(job.c.job_id == params["p_job_id"])
            ).scalar()
            if depends_on == params["p_parent_id"]:
                # A chain step released already, sent again by a second execution of the
                # step before it (recovered from a dead node): the step runs once.
                logger.info("ratchet: chain step %s was released already", params["p_job_id"])
                return None
        # Before anything re-arms a finished row: one that holds this very message was
        # written by an earlier try of this send whose reply was lost, and may have run.
        if retried and self._holds_message(conn, params):
            logger.info(
                "ratchet: job %s was stored by an earlier try whose reply was lost",
                params["p_job_id"],
            )
            return None
        try:
            with guard():
                if conn.execute(self._reuse_finished, params).rowcount == 1:
                    return None
        except IntegrityError as exc:
            key = params["p_business_key"]
            if key is None or not _is_active_key_conflict(exc):
                raise
            holder = self._holder_of(conn, key)
            if holder is not None:
                return holder
            raise StoreBusy(
                f"the business key of job {params['p_job_id']!r} changed hands while the "
                "job was re-armed; no job was enqueued, send it again"
            ) from exc
        raise DuplicateJob(params["p_job_id"])

    def _holds_message(self, conn: Connection, params: dict[str, Any]) -> bool:
        """Whether the row of this job id holds this message (headers and payload)."""
        stored = conn.execute(
            select(job.c.headers, job.c.payload).where(job.c.job_id == params["p_job_id"])
        ).first()
        return (
            stored is not None
            and stored.headers == params["p_headers"]
            and _bytes(stored.payload) == _bytes(params["p_payload"])
        )

    def replace_running(self, token: str, new: NewJob) -> bool:
        """Reschedule the row this claim owns with a new message (a retry, a replace).

        False when the claim was lost: the row belongs to another execution now.
        """
        params = {**_params(new), "p_token": token}
        permit = scheduler_resource_permit
        release = delete(permit).where(permit.c.job_id == new.job_id, permit.c.claim_token == token)

        def work(conn: Connection) -> bool:
            if conn.execute(self._replace_running, params).rowcount != 1:
                return False
            conn.execute(release)  # a permit is held per execution, not across retries
            return True

        return self._run(work, "the job was not rescheduled")

    # -- claim and settle -------------------------------------------------------------------

    def claim(self, node_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]:
        """Claim up to ``limit`` due jobs of ``queues`` that need no resource permit."""
        if limit <= 0 or not queues:
            return []
        shape = ClaimShape(len(queues), False, self._boost_for(queues))
        token = uuid.uuid4().hex
        params = claim_params(node_id, token, queues, limit)

        def claim(conn: Connection) -> Claimed:
            if not self._claim.needs_transaction:
                return self._claim.claim(conn, shape, params)
            with transaction(conn):
                return self._claim.claim(conn, shape, params)

        return self._claiming(token, claim)

    def claim_for_resource(
        self, node_id: str, queues: Sequence[str], resource: str, capacity: int, limit: int
    ) -> list[ClaimedJob]:
        """Claim due jobs needing ``resource``, as many as its free permits allow (at most
        ``capacity`` such jobs RUNNING cluster-wide), each with its permit, atomically."""
        if limit <= 0 or capacity <= 0 or not queues:
            return []
        shape = ClaimShape(len(queues), True, self._boost_for(queues))
        token = uuid.uuid4().hex
        self._ensure_resource_row(resource, capacity)

        def claim(conn: Connection) -> Claimed:
            with transaction(conn):
                self._lock_resource(conn, resource, capacity)
                conn.execute(self._drop_stale_permits, {"resource": resource})
                held = conn.execute(self._count_permits, {"resource": resource}).scalar_one()
                free = min(capacity - held, limit)
                if free <= 0:
                    return Claimed([], [])
                params = claim_params(node_id, token, queues, free, resource)
                claimed = self._claim.claim(conn, shape, params)
                if claimed.jobs:  # a malformed row is failed at once: it needs no permit
                    permits = [
                        {"resource": resource, "job_id": j.job_id, "node_id": node_id}
                        for j in claimed.jobs
                    ]
                    conn.execute(
                        insert(scheduler_resource_permit).values(
                            acquired_at=db_now(), claim_token=token
                        ),
                        permits,
                    )
                return claimed

        return self._claiming(token, claim)

    def _boost_for(self, queues: Sequence[str]) -> float:
        # Recurring masters fire strictly by due time; aging would only cost them.
        return 0.0 if list(queues) == [SCHEDULES_QUEUE] else self.priority_boost_minutes

    def _claiming(self, token: str, claim: Callable[[Connection], Claimed]) -> list[ClaimedJob]:
        tries = 0

        def work(conn: Connection) -> Claimed:
            nonlocal tries
            tries += 1
            if tries > 1:
                # The connection broke after an earlier try: that claim may have committed
                # with its reply lost. Take its rows over rather than leave them RUNNING.
                adopted = self._claimed_with(conn, token)
                if adopted.jobs or adopted.malformed:
                    return adopted
            return claim(conn)

        claimed = self._run(work, "no job was claimed")
        if claimed.malformed:
            self._fail_malformed(token, claimed.malformed)
        jobs = sorted(claimed.jobs, key=lambda j: j.id)
        return _best_first(jobs, self.priority_boost_minutes)

    def _fail_malformed(self, token: str, rows: Sequence[MalformedRow]) -> None:
        """Fail claimed rows that cannot be run, with the reason; never their arguments.
        Were this write lost, the rows stay claimed until orphan recovery, then fail again."""
        settlements = []
        for row in rows:
            reason = f"job row {row.id} cannot be run: {row.reason}; it was failed unrun"
            logger.error("ratchet: job %s: %s", row.job_id, reason)
            error = error_record("MalformedJob", [reason], "celery_ratchet.errors")
            settlements.append(Settlement(row.job_id, token, JobStatus.FAILED, error=error))
        try:
            self.settle(settlements)
        except RatchetError as exc:
            logger.warning("ratchet: malformed jobs were not failed yet: %s", exc)

    def _ensure_resource_row(self, resource: str, capacity: int) -> None:
        if resource in self._known_resources:
            return
        r = scheduler_resource
        stmt = _insert_ignoring_duplicates(
            self.engine.dialect, r, {"resource": resource, "capacity": capacity}
        )
        self._run(lambda conn: conn.execute(stmt), "the resource was not registered")
        self._known_resources.add(resource)

    def _lock_resource(self, conn: Connection, resource: str, capacity: int) -> None:
        """Serialise the claims of one resource: the row lock (SQLite: the write lock taken
        by BEGIN IMMEDIATE) is held until the permits are written."""
        r = scheduler_resource
        lock = (
            update(r).where(r.c.resource == resource).values(capacity=capacity, updated_at=db_now())
        )
        if conn.execute(lock).rowcount == 0:  # the row was deleted by hand: make it again
            values = {"resource": resource, "capacity": capacity}
            conn.execute(_insert_ignoring_duplicates(conn.dialect, r, values))
            conn.execute(lock)

    def _claimed_with(self, conn: Connection, token: str) -> Claimed:
        rows = conn.execute(self._select_claimed, {"token": token}).all()
        return decode(rows, token)

    def running_claims(self, node_id: str, *, older_than_seconds: float) -> list[tuple[str, str]]:
        """(job id, claim token) of every row ``node_id`` has held RUNNING for a while."""
        stmt = select(job.c.job_id, job.c.claim_token).where(
            job.c.status == JobStatus.RUNNING.value,
            job.c.picked_by == node_id,
            or_(job.c.claimed_at.is_(None), job.c.claimed_at < db_now_minus(older_than_seconds)),
        )
        rows = self._run(lambda conn: conn.execute(stmt).all(), "claims were not listed")
        return [(r.job_id, r.claim_token) for r in rows]

    def settle(self, settlements: Iterable[Settlement]) -> int:
        """Finish claimed executions in one round trip where the driver pipelines. Rows whose
        claim is gone are left alone; returns the number of rows changed."""
        settlements = list(settlements)
        params = [
            {"p_job_id": s.job_id, "p_token": s.token, "p_status": s.status.value,
             "p_error": storable(s.error), "p_traceback": storable(s.traceback)}
            for s in settlements
        ]  # fmt: skip
        if not params:
            return 0
        held: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for s in settlements:
            if s.resource is not None:
                held[s.resource].append((s.job_id, s.token))
        permit = scheduler_resource_permit
        releases = [
            delete(permit).where(
                permit.c.resource == resource,
                tuple_(permit.c.job_id, permit.c.claim_token).in_(claims),
            )
            for resource, claims in held.items()
        ]

        ending = [s for s in settlements if s.status.value in _CANCELS_DOWNSTREAM]

        def work(conn: Connection) -> int:
            if not ending:
                return settle_rows(conn)
            with transaction(conn):  # parts and counters change with the outcome
                return settle_rows(conn)

        handed_back = [s.job_id for s in settlements if s.status is JobStatus.PENDING]

        def settle_rows(conn: Connection) -> int:
            # Only the rows this settle ends: the result backend usually stored the outcome
            # first (with its part, and the steps after it revoked), and the job may have
            # been retried from the dead-letter queue since; an old settle arriving then
            # must not revoke the chain steps the retry restored, nor recount the batch.
            ended = self._still_held(conn, ending)
            changed = self._settle_counting_dead_letters(conn, params)
            if handed_back:  # due again at once, for any node: wake the idle ones
                self._announce_queues_of(conn, handed_back)
            for release in releases:  # one statement per resource, not per job
                conn.execute(release)
            # Celery reports the children of chords it ran itself; these are for those it
            # never got to run (unknown task, malformed, revoked in the buffer).
            ended_parts: dict[str, list[str]] = defaultdict(list)
            for s in ended:
                cancel_downstream(conn, s.job_id, s.error)
                state = "FAILURE" if s.status is JobStatus.FAILED else "REVOKED"
                ended_parts[state].append(s.job_id)
            for state, ids in ended_parts.items():
                record_ended_parts(conn, ids, state)
            return changed

        return self._run(work, "job outcomes were not recorded")

    def _still_held(self, conn: Connection, settlements: list[Settlement]) -> list[Settlement]:
        """Those of ``settlements`` whose claim still holds its job (RUNNING under it)."""
        if not settlements:
            return []
        claims = [(s.job_id, s.token) for s in settlements]
        held = {
            r.job_id
            for r in conn.execute(
                select(job.c.job_id).where(
                    job.c.status == JobStatus.RUNNING.value,
                    tuple_(job.c.job_id, job.c.claim_token).in_(claims),
                )
            )
        }
        return [s for s in settlements if s.job_id in held]

    def _settle_counting_dead_letters(self, conn: Connection, params: list[dict[str, Any]]) -> int:
        """Settle, counting the jobs this settle fails into their alert windows. Those rows
        are changed one at a time, so only the ones this settle changed count (the result
        backend may have failed the same claim already, and counted it then)."""
        failing = JobStatus.FAILED.value
        if self.dlq_alert_task is None or all(p["p_status"] != failing for p in params):
            return self._settle_rows(conn, params)
        others = [p for p in params if p["p_status"] != failing]
        changed = self._settle_rows(conn, others) if others else 0
        newly_failed = []
        for p in params:
            if p["p_status"] == failing and conn.execute(self._settle_one, p).rowcount == 1:
                changed += 1
                newly_failed.append((p["p_job_id"], p["p_token"]))
        self._count_dead_letters(conn, dlq_alerts.dead_letters(conn, newly_failed))
        return changed

    def _count_dead_letters(self, conn: Connection, letters: list[dlq_alerts.DeadLetter]) -> None:
        if self.dlq_alert_task is not None and letters:
            dlq_alerts.count_dead_letters(conn, letters, excluded=self.dlq_alert_task)

    def _settle_rows(self, conn: Connection, params: list[dict[str, Any]]) -> int:
        if self.family != "mysql":  # executemany: pipelined by psycopg and sqlite3
            return conn.execute(self._settle_one, params).rowcount
        # PyMySQL would send executemany row by row: group the plain outcomes instead.
        plain = [p for p in params if p["p_error"] is None and p["p_traceback"] is None]
        changed = 0
        for p in params:
            if p["p_error"] is not None or p["p_traceback"] is not None:
                changed += conn.execute(self._settle_one, p).rowcount
        for status, claims in _group_by_outcome(plain).items():
            stmt = (
                update(job)
                .where(
                    job.c.status == JobStatus.RUNNING.value,
                    tuple_(job.c.job_id, job.c.claim_token).in_(claims),
                )
                .values(**_settled_values(JobStatus(status)))
            )
            changed += conn.execute(stmt).rowcount
        return changed

    def defer(self, deferrals: Sequence[tuple[str, str, datetime]]) -> int:
        """Give claimed jobs back, due at the given times, as if never claimed (an open
        circuit breaker): no attempt is counted. Returns how many were still held."""
        if not deferrals:
            return 0
        permit = scheduler_resource_permit
        params = [{"p_job_id": j, "p_token": t, "p_due": due} for j, t, due in deferrals]
        back = (
            update(job)
            .where(*_held(bindparam("p_job_id"), bindparam("p_token")))
            .values(
                status=JobStatus.PENDING.value,
                scheduled_time=bindparam("p_due", type_=UTCDateTime()),
                claims=job.c.claims - 1,
                **_CLEARED_CLAIM,
            )
        )
        release = delete(permit).where(
            permit.c.job_id == bindparam("p_job_id"), permit.c.claim_token == bindparam("p_token")
        )

        def work(conn: Connection) -> int:
            with transaction(conn):
                changed = conn.execute(back, params).rowcount
                conn.execute(release, [{"p_job_id": j, "p_token": t} for j, t, _ in deferrals])
                self._announce_queues_of(conn, [j for j, _, _ in deferrals])
            return changed

        return self._run(work, "no job was deferred")

    def store_outcome(
        self,
        job_id: str,
        token: str,
        status: JobStatus,
        *,
        job_result: str | None = None,
        result_type: str | None = None,
        result_meta: str | None = None,
        error: str | None = None,
        traceback: str | None = None,
        part: BatchPart | None = None,
    ) -> bool:
        """Finish the execution this claim owns, with its result; False if the claim was lost.

        ``part``: the job is a child of a batch, which counts it in the same transaction."""
        params = {
            "p_job_id": job_id,
            "p_token": token,
            "p_status": status.value,
            "p_job_result": job_result,
            "p_result_type": result_type,
            "p_result_meta": result_meta,
            "p_error": storable(error),
            "p_traceback": storable(traceback),
        }
        cancels = status.value in _CANCELS_DOWNSTREAM

        def work(conn: Connection) -> bool:
            if part is None and not cancels:
                return bool(conn.execute(self._store_outcome, params).rowcount == 1)
            with transaction(conn):
                if conn.execute(self._store_outcome, params).rowcount != 1:
                    return False
                if part is not None:
                    record_part(conn, part)
                if cancels:
                    cancel_downstream(conn, job_id, error)
                if status is JobStatus.FAILED:
                    self._count_dead_letters(conn, dlq_alerts.dead_letters(conn, [(job_id, token)]))
                return True

        return self._run(work, "the result was not stored")

    def store_untracked_result(
        self,
        job_id: str,
        task_name: str,
        status: JobStatus,
        *,
        job_result: str | None = None,
        result_type: str | None = None,
        result_meta: str | None = None,
        error: str | None = None,
        traceback: str | None = None,
    ) -> None:
        """A result written without a claim (an eager run, a manual ``mark_as_*``).

        A finished row takes the new state; an active row keeps its state (its claim decides)
        but records the result; with no row, a finished row is inserted.
        """
        result_values = {
            "job_result": job_result,
            "result_type": result_type,
            "result_meta": result_meta,
            "last_error": error,
            "error_traceback": traceback,
        }

        # A revoked job never ran, so it cannot have failed since: it stays REVOKED and keeps
        # the error (Celery writes a failed chain step's exception to the steps after it).
        new_status: Any = status.value
        if status is JobStatus.FAILED:
            new_status = case(
                (job.c.status == JobStatus.REVOKED.value, JobStatus.REVOKED.value),
                else_=status.value,
            )

        def work(conn: Connection) -> None:
            finished = conn.execute(
                update(job)
                .where(job.c.job_id == job_id, job.c.status.in_(_TERMINAL))
                .values(status=new_status, finished_at=db_now(), **result_values)
            ).rowcount
            if finished:
                return
            active = conn.execute(
                update(job).where(job.c.job_id == job_id).values(**result_values)
            ).rowcount
            if active:
                return
            # Inserted concurrently by another writer: that row stands.
            with contextlib.suppress(IntegrityError):
                conn.execute(
                    insert(job).values(
                        job_id=job_id,
                        task_name=task_name,
                        queue="",
                        status=status.value,
                        priority=0,
                        scheduled_time=db_now(),
                        created_at=db_now(),
                        finished_at=db_now(),
                        payload=b"",
                        content_type="",
                        content_encoding="",
                        headers="{}",
                        properties="{}",
                        **result_values,
                    )
                )

        self._run(work, "the result was not stored")

    def holds(self, job_id: str, token: str) -> bool:
        """Whether this claim still owns the job (it is RUNNING under it)."""
        stmt = select(job.c.id).where(*_held(job_id, token))
        return bool(self._run(lambda conn: conn.execute(stmt).first() is not None, "not read"))

    def note_retry(self, job_id: str, error: str | None, traceback: str | None) -> None:
        """Record why a job that was just rescheduled for a retry failed."""
        stmt = (
            update(job)
            .where(job.c.job_id == job_id, job.c.status == JobStatus.PENDING.value)
            .values(last_error=error, error_traceback=traceback)
        )
        self._run(lambda conn: conn.execute(stmt), "the retry reason was not stored")

    def store_progress(self, job_id: str, token: str, meta: str | None, *, started: bool) -> None:
        """A running job's interim state (STARTED, or a custom one from ``update_state``)."""
        values: dict[str, Any] = {"result_meta": meta}
        if started:
            values["started_at"] = db_now()
        stmt = update(job).where(*_held(job_id, token)).values(**values)
        self._run(lambda conn: conn.execute(stmt), "the job's progress was not stored")

    # -- results ----------------------------------------------------------------------------

    def result(self, job_id: str) -> ResultRecord | None:
        stmt = select(
            job.c.job_id,
            job.c.task_name,
            job.c.status,
            job.c.attempts,
            job.c.queue,
            job.c.job_result,
            job.c.result_type,
            job.c.result_meta,
            job.c.last_error,
            job.c.error_traceback,
            job.c.finished_at,
            job.c.picked_by,
            job.c.headers,
            job.c.payload,
            job.c.content_type,
            job.c.content_encoding,
        ).where(job.c.job_id == job_id)
        row = self._run(lambda conn: conn.execute(stmt).first(), "the result was not read")
        if row is None:
            return None
        return ResultRecord(
            **{**row._asdict(), "status": parse_status(row.status), "payload": _bytes(row.payload)}
        )

    def forget(self, job_id: str) -> None:
        """Drop a finished job's row; an active job only loses its stored result."""

        def work(conn: Connection) -> None:
            deleted = conn.execute(
                delete(job).where(job.c.job_id == job_id, job.c.status.in_(_TERMINAL))
            ).rowcount
            if not deleted:
                conn.execute(
                    update(job)
                    .where(job.c.job_id == job_id)
                    .values(job_result=None, result_type=None, result_meta=None)
                )

        self._run(work, "the result was not forgotten")

    def expire_results(self, older_than_seconds: float) -> int:
        """Clear stored return values of jobs finished longer ago than the given age."""
        stmt = (
            update(job)
            .where(
                job.c.status.in_(_TERMINAL),
                job.c.finished_at < db_now_minus(older_than_seconds),
                job.c.job_result.is_not(None),
            )
            .values(job_result=None, result_meta=None)
        )
        return self._run(lambda conn: conn.execute(stmt).rowcount, "results were not expired")

    def save_group(self, group_id: str, result: str) -> None:
        g = scheduler_group_result

        def work(conn: Connection) -> None:
            with transaction(conn):
                conn.execute(delete(g).where(g.c.group_id == group_id))
                conn.execute(
                    insert(g).values(group_id=group_id, result=result, created_at=db_now())
                )

        self._run(work, "the group was not saved")

    def load_group(self, group_id: str) -> str | None:
        g = scheduler_group_result
        stmt = select(g.c.result).where(g.c.group_id == group_id)
        return self._run(lambda conn: conn.execute(stmt).scalar(), "the group was not read")

    def delete_group(self, group_id: str) -> None:
        g = scheduler_group_result
        stmt = delete(g).where(g.c.group_id == group_id)
        self._run(lambda conn: conn.execute(stmt), "the group was not deleted")

    def revoke_pending(self, job_ids: Sequence[str], error: str) -> int:
        """Pending jobs become REVOKED and never run; returns how many were pending."""
        return self.request_revoke(job_ids, error)[0]

    def request_revoke(
        self,
        job_ids: Sequence[str],
        error: str,
        *,
        terminate_signal: str | None = None,
        batches: list[str] | None = None,
    ) -> tuple[int, int]:
        """Pending jobs become REVOKED; running ones are marked for their node, which drops
        them if not started yet and, given ``terminate_signal``, terminates them.
        Returns (pending revoked, running marked). Revoked children of chords and batches
        are counted as ended; ``batches`` receives the ids of those batches."""
        if not job_ids:
            return 0, 0
        ids = list(job_ids)
        not_started = [JobStatus.PENDING.value, JobStatus.WAITING.value]
        pending = (
            update(job)
            .where(job.c.job_id.in_(ids), job.c.status.in_(not_started))
            .values(status=JobStatus.REVOKED.value, finished_at=db_now(), last_error=error)
        )
        running = (
            update(job)
            .where(job.c.job_id.in_(ids), job.c.status == JobStatus.RUNNING.value)
            .values(revoke_requested=terminate_signal or REVOKE_ONLY)
        )

        def work(conn: Connection) -> tuple[int, int]:
            # One transaction, running rows first: a job moving from RUNNING back to PENDING
            # (a retry) in between is caught by one statement or the other.
            with transaction(conn):
                marked = conn.execute(running).rowcount
                not_run = [
                    r.job_id
                    for r in conn.execute(
                        select(job.c.job_id)
                        .where(job.c.job_id.in_(ids), job.c.status.in_(not_started))
                        .with_for_update()
                    )
                ]
                revoked = conn.execute(pending).rowcount if not_run else 0
                if marked:  # delivered at commit: the nodes check their revocations now
                    self._announce(conn, REVOCATIONS_WAKEUP)
                # A running step decides for itself: it may still succeed and go on.
                cancel_downstream(conn, not_run, error)
                touched = record_ended_parts(conn, not_run, "REVOKED")
                if batches is not None:
                    batches.extend(touched)
                return revoked, marked

        return self._run(work, "no job was revoked")

    def announce(self, word: str) -> None:
        """PostgreSQL with LISTEN/NOTIFY on: tell listening workers ``word`` now."""
        if self.notify:
            self._run(lambda conn: self._announce(conn, word), "no wake-up was sent")

    def _announce(self, conn: Connection, word: str) -> None:
        """PostgreSQL with LISTEN/NOTIFY on: tell listening workers ``word`` (a queue name,
        or a word such as ``REVOCATIONS_WAKEUP``), delivered when the transaction commits."""
        if self.notify:
            conn.execute(select(func.pg_notify(NOTIFY_CHANNEL, word)))

    def _announce_queues_of(self, conn: Connection, job_ids: Sequence[str]) -> None:
        """Tell listening workers the queues of these jobs (each queue once: PostgreSQL
        delivers one notification per distinct payload of a transaction)."""
        if self.notify and job_ids:
            conn.execute(
                select(func.pg_notify(NOTIFY_CHANNEL, job.c.queue)).where(
                    job.c.job_id.in_(list(job_ids))
                )
            )

    def next_due_in(self, queues: Sequence[str]) -> float | None:
        """Seconds (by the database's clock) until the earliest pending job of ``queues`` is
        due: negative when one is overdue, None when none is pending."""
        if not queues:
            return None
        stmt = select(func.min(job.c.scheduled_time), db_now()).where(
            job.c.status == JobStatus.PENDING.value, job.c.queue.in_(list(queues))
        )
        due, now = self._run(lambda conn: conn.execute(stmt).one(), "no due time was read")
        return None if due is None else (due - now).total_seconds()

    def revocations(self, node_id: str) -> list[tuple[str, str, str]]:
        """(job id, claim token, request) of this node's running jobs asked to stop; the
        request is ``REVOKE`` or a signal name."""
        stmt = select(job.c.job_id, job.c.claim_token, job.c.revoke_requested).where(
            job.c.status == JobStatus.RUNNING.value,
            job.c.picked_by == node_id,
            job.c.revoke_requested.is_not(None),
        )
        rows = self._run(lambda conn: conn.execute(stmt).all(), "revocations were not read")
        return [(r.job_id, r.claim_token, r.revoke_requested) for r in rows]

    def purge_pending(self, queues: Sequence[str]) -> int:
        stmt = delete(job).where(
            job.c.status == JobStatus.PENDING.value, job.c.queue.in_(list(queues))
        )
        return self._run(lambda conn: conn.execute(stmt).rowcount, "no job was purged")

    # -- the dead-letter queue: FAILED jobs ----------------------------------------------------

    def _failed(
        self, job_ids: Sequence[str] | None, task_name: str | None, queue: str | None
    ) -> Any:
        conditions = [job.c.status == JobStatus.FAILED.value]
        if job_ids is not None:
            conditions.append(job.c.job_id.in_(list(job_ids)))
        if task_name is not None:
            conditions.append(job.c.task_name == task_name)
        if queue is not None:
            conditions.append(job.c.queue == queue)
        return and_(*conditions)

    def retry_failed(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        task_name: str | None = None,
        queue: str | None = None,
        rewrite_headers: Callable[[str], str] = lambda headers: headers,
    ) -> int:
        """Send FAILED jobs (all, or those named or matching) back to PENDING, due now, with
        their error cleared and attempts restarted at 0; ``rewrite_headers`` restarts the
        message's own retry count. Returns how many were requeued."""
        if job_ids is not None and not job_ids:
            return 0
        where = self._failed(job_ids, task_name, queue)
        requeue = (
            update(job)
            .where(job.c.job_id == bindparam("p_job_id"), job.c.status == JobStatus.FAILED.value)
            .values(
                status=JobStatus.PENDING.value,
                scheduled_time=db_now(),
                expires_at=None,
                attempts=0,
                claims=0,
                headers=bindparam("p_headers"),
                **_CLEARED_CLAIM,
                **_CLEARED_RESULT,
            )
        )
        page = (
            select(job.c.id, job.c.job_id, job.c.headers)
            .where(where, job.c.id > bindparam("after"))
            .order_by(job.c.id)
            .limit(500)
        )

        def requeue_page(conn: Connection, after: int) -> tuple[int, int | None]:
            rows = conn.execute(page, {"after": after}).all()
            if not rows:
                return 0, None
            params = [{"p_job_id": r.job_id, "p_headers": rewrite_headers(r.headers)} for r in rows]
            with transaction(conn):
                changed = self._requeue_each(conn, requeue, params)
                # The chain steps its failure revoked wait for it again.
                restore_downstream(conn, [r.job_id for r in rows])
                self._announce_queues_of(conn, [r.job_id for r in rows])
            return changed, rows[-1].id

        done, after = 0, 0
        while True:
            changed, last = self._run(
                functools.partial(requeue_page, after=after), "no job was requeued"
            )
            if last is None:
                return done
            done, after = done + changed, last

    def _requeue_each(self, conn: Connection, requeue: Any, params: list[dict[str, Any]]) -> int:
        """Requeue FAILED rows in one statement; when one's business key is held by an active
        job meanwhile, one by one, leaving those FAILED (two active jobs of a key may not be)."""
        try:
            with savepoint(conn, "ratchet_requeue"):
                return int(conn.execute(requeue, params).rowcount)
        except IntegrityError as exc:
            if not _is_active_key_conflict(exc):
                raise
        changed = 0
        for p in params:
            try:
                with savepoint(conn, "ratchet_requeue"):
                    changed += conn.execute(requeue, p).rowcount
            except IntegrityError as exc:
                if not _is_active_key_conflict(exc):
                    raise
                logger.warning(
                    "ratchet: failed job %s left in the dead-letter queue: another active job "
                    "holds its business key",
                    p["p_job_id"],
                )
        return changed

    def purge_failed(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        task_name: str | None = None,
        queue: str | None = None,
    ) -> int:
        """Delete FAILED jobs (all, or those named or matching); returns how many."""
        if job_ids is not None and not job_ids:
            return 0
        stmt = delete(job).where(self._failed(job_ids, task_name, queue))
        return self._run(lambda conn: conn.execute(stmt).rowcount, "the DLQ was not purged")

    # -- archiving and job logs --------------------------------------------------------------

    def archive_finished(
        self,
        older_than_days: float,
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """Move finished jobs (finished longer ago than ``older_than_days``) to
        ``scheduler_job_archive``, ``batch_size`` rows per transaction. Returns how many."""
        cutoff = db_now_minus(older_than_days * 86400)
        columns = [c.name for c in scheduler_job.columns]
        picked = (
            select(job.c.id)
            .where(job.c.status.in_(_TERMINAL), job.c.finished_at < cutoff)
            .order_by(job.c.id)
            .limit(batch_size)
        )
        ids: BindParameter[Any] = bindparam("ids", expanding=True)
        copy = scheduler_job_archive.insert().from_select(
            [*columns, "archived_at"],
            select(*[job.c[c] for c in columns], db_now()).where(job.c.id.in_(ids)),
        )
        # Re-checked on delete: a finished job whose id was reused in between stays.
        remove = delete(job).where(job.c.id.in_(ids), job.c.status.in_(_TERMINAL))

        def one_batch(conn: Connection) -> int:
            with transaction(conn):
                chosen = list(conn.execute(picked).scalars())
                if not chosen:
                    return 0
                conn.execute(copy, {"ids": chosen})
                conn.execute(remove, {"ids": chosen})
                return len(chosen)

        moved = 0
        while True:
            done = self._run(one_batch, "finished jobs were not archived")
            moved += done
            if progress is not None and done:
                progress(moved)
            if done < batch_size:
                return moved

    def add_log(self, job_id: str, level: str, message: str) -> None:
        stmt = insert(scheduler_job_log).values(
            job_id=job_id, logged_at=db_now(), level=level[:16], message=storable(message) or ""
        )
        self._run(lambda conn: conn.execute(stmt), "the job log line was not written")

    def job_log(self, job_id: str, limit: int = 1000) -> list[tuple[datetime, str, str]]:
        lg = scheduler_job_log
        stmt = (
            select(lg.c.logged_at, lg.c.level, lg.c.message)
            .where(lg.c.job_id == job_id)
            .order_by(lg.c.id)
            .limit(limit)
        )
        rows = self._run(lambda conn: conn.execute(stmt).all(), "the job log was not read")
        return [(r.logged_at, r.level, r.message) for r in rows]

    def purge_logs(self, older_than_days: float) -> int:
        lg = scheduler_job_log
        stmt = delete(lg).where(lg.c.logged_at < db_now_minus(older_than_days * 86400))
        return self._run(lambda conn: conn.execute(stmt).rowcount, "job logs were not purged")

    # -- inspection -------------------------------------------------------------------------

    def list_jobs(
        self,
        *,
        status: JobStatus | None = None,
        task_name: str | None = None,
        queue: str | None = None,
        tag: str | None = None,
        business_key: str | None = None,
        limit: int = 50,
        include_schedules: bool = False,
        before_job_id: str | None = None,
    ) -> list[JobSummary]:
        """Jobs, newest first; recurring masters (schedules) only with ``include_schedules``.
        ``before_job_id``: the next page, the jobs older than that one (a keyset: no OFFSET,
        so a page deep in a million rows costs what the first one does)."""
        conditions: list[Any] = []
        if before_job_id is not None:
            cursor = select(job.c.id).where(job.c.job_id == before_job_id).scalar_subquery()
            conditions.append(job.c.id < cursor)
        if not include_schedules:
            conditions.append(_JOBS_ONLY)
        if tag is not None:
            # A tag is matched as written: % and _ in it are no wildcards.
            conditions.append(job.c.tags.contains(f",{tag},", autoescape=True))
        if business_key is not None:
            conditions.append(job.c.business_key == business_key)
        if status is not None:
            conditions.append(job.c.status == status.value)
        if task_name is not None:
            conditions.append(job.c.task_name == task_name)
        if queue is not None:
            conditions.append(job.c.queue == queue)
        stmt = (
            select(
                job.c.job_id,
                job.c.task_name,
                job.c.queue,
                job.c.status,
                job.c.priority,
                job.c.attempts,
                _listed(job.c.scheduled_time),
                _listed(job.c.created_at),
                _listed(job.c.finished_at),
                job.c.picked_by,
                job.c.last_error,
                job.c.business_key,
                job.c.tags,
            )
            .where(and_(*conditions))
            .order_by(job.c.id.desc())
            .limit(limit)
        )
        rows = self._run(lambda conn: conn.execute(stmt).all(), "jobs were not listed")
        return [_summary(r) for r in rows]

    # -- recurring masters ------------------------------------------------------------------

    def upsert_master(self, master: NewJob) -> str:
        """Register a recurring master; its job id (from the business key) makes it unique.
        Registering again updates it in place: 'created', 'updated', or 'revived' (a
        cancelled master registered again)."""
        params = _params(master)
        spec_changed = job.c.schedule_spec != bindparam("p_schedule_spec")
        redefine = (
            update(job)
            .where(job.c.job_id == master.job_id, job.c.status.in_(_ACTIVE))
            .values(
                **{k: v for k, v in _new_job_values().items() if k in _DEFINITION},
                # A new schedule takes effect now, not after the old one's next fire.
                scheduled_time=case(
                    (
                        and_(spec_changed, job.c.status == JobStatus.PENDING.value),
                        bindparam("p_due", type_=UTCDateTime()),
                    ),
                    else_=job.c.scheduled_time,
                ),
            )
        )

        def work(conn: Connection) -> str:
            try:
                conn.execute(self._insert, params)
                return "created"
            except IntegrityError:
                pass
            # The insert notifies by itself; an update in place tells the workers too, whose
            # schedule checks sleep until the next due time they know of.
            if conn.execute(redefine, params).rowcount == 1:
                self._announce(conn, SCHEDULES_QUEUE)
                return "updated"
            if conn.execute(self._reuse_finished, params).rowcount == 1:
                self._announce(conn, SCHEDULES_QUEUE)
                return "revived"
            conn.execute(self._insert, params)  # deleted in between: insert it after all
            return "created"

        return self._run(work, "the recurring job was not registered")

    def fire_master(
        self, master: ClaimedJob, occurrences: Sequence[NewJob], next_due: datetime | None
    ) -> bool:
        """Create a claimed master's occurrences and set its next due time, atomically.

        Occurrence ids are unique per (master, fire time): one that exists already is left
        alone, so a master fired twice for the same time (after a crash) creates nothing
        twice. False, with nothing written, when the master's claim was lost.
        """
        params = [_params(o) for o in occurrences]
        resume = (
            update(job)
            .where(*_held(master.job_id, master.token))
            .values(
                status=(JobStatus.PENDING if next_due else JobStatus.SUCCEEDED).value,
                scheduled_time=next_due or master.scheduled_time,
                finished_at=None if next_due else db_now(),
                **_CLEARED_CLAIM,
            )
        )

        def work(conn: Connection) -> bool:
            with transaction(conn):
                if params:
                    self._insert_many(conn, params, ignore_existing=True)
                if conn.execute(resume).rowcount != 1:
                    raise _ClaimLost
            return True

        try:
            return self._run(work, "the recurring job did not fire")
        except _ClaimLost:
            return False

    def fire_masters(
        self, firings: Sequence[tuple[ClaimedJob, Sequence[NewJob], datetime | None]]
    ) -> list[bool]:
        """:meth:`fire_master` for many claimed masters in one transaction: every
        occurrence in one insert, the masters' next due times in one UPDATE per distinct
        (claim, next due time). When any master's claim was lost, nothing of the batch is
        kept and each is fired on its own instead, so that the others still fire; the
        result says, per master, whether it fired."""
        if len(firings) <= 1:
            return [self.fire_master(*f) for f in firings]
        params = [_params(o) for _, occurrences, _ in firings for o in occurrences]
        groups: dict[tuple[str, datetime | None], list[str]] = {}
        for master, _, next_due in firings:
            groups.setdefault((master.token, next_due), []).append(master.job_id)
        statements = []
        for (token, next_due), job_ids in groups.items():
            for start in range(0, len(job_ids), _MASTER_IDS_PER_UPDATE):
                chunk = job_ids[start : start + _MASTER_IDS_PER_UPDATE]
                values: dict[str, Any] = dict(_CLEARED_CLAIM)
                if next_due is None:  # no fire time left: the schedule is over
                    values.update(status=JobStatus.SUCCEEDED.value, finished_at=db_now())
                else:
                    values.update(status=JobStatus.PENDING.value, scheduled_time=next_due)
                held = and_(
                    job.c.job_id.in_(chunk),
                    job.c.claim_token == token,
                    job.c.status == JobStatus.RUNNING.value,
                )
                statements.append((update(job).where(held).values(**values), len(chunk)))

        def work(conn: Connection) -> bool:
            with transaction(conn):
                if params:
                    self._insert_many(conn, params, ignore_existing=True)
                for statement, expected in statements:
                    if conn.execute(statement).rowcount != expected:
                        raise _ClaimLost
            return True

        try:
            self._run(work, "the recurring jobs did not fire")
        except _ClaimLost:
            return [self.fire_master(*f) for f in firings]
        return [True] * len(firings)

    def set_master_status(
        self, job_id: str, status: JobStatus, *, due: datetime | None = None
    ) -> bool:
        """Pause (PENDING → PAUSED), resume (PAUSED → PENDING at ``due``) or cancel (any
        active → REVOKED) a recurring master; False when it was not in a state to."""
        allowed = {
            JobStatus.PAUSED: [JobStatus.PENDING.value],
            JobStatus.PENDING: [JobStatus.PAUSED.value],
            JobStatus.REVOKED: list(_ACTIVE),
        }[status]
        values: dict[str, Any] = {"status": status.value}
        if status is JobStatus.PENDING and due is not None:
            values["scheduled_time"] = due
        if status is JobStatus.REVOKED:
            values["finished_at"] = db_now()
        stmt = (
            update(job)
            .where(
                job.c.job_id == job_id,
                job.c.job_type == JobType.RECURRING.value,
                job.c.status.in_(allowed),
            )
            .values(**values)
        )

        def work(conn: Connection) -> bool:
            changed = conn.execute(stmt).rowcount == 1
            if changed and status is JobStatus.PENDING:  # resumed: due again
                self._announce(conn, SCHEDULES_QUEUE)
            return changed

        return self._run(work, "the recurring job was not changed")

    def list_masters(self, *, include_cancelled: bool = False) -> list[dict[str, Any]]:
        conditions = [job.c.job_type == JobType.RECURRING.value]
        if not include_cancelled:
            conditions.append(job.c.status.in_(_ACTIVE))
        stmt = (
            select(
                job.c.job_id,
                job.c.business_key,
                job.c.task_name,
                job.c.status,
                job.c.priority,
                job.c.scheduled_time,
                job.c.schedule_spec,
            )
            .where(*conditions)
            .order_by(job.c.business_key)
        )
        rows = self._run(lambda conn: conn.execute(stmt).all(), "schedules were not listed")
        return [r._asdict() for r in rows]

    # -- nodes ------------------------------------------------------------------------------

    def register_node(
        self, node_id: str, hostname: str, pid: int, queues: Sequence[str], concurrency: int
    ) -> datetime:
        """Register a node; returns the moment it was registered, by the database clock
        (what it may have been asked to do is what was asked from then on)."""
        n = scheduler_node

        def work(conn: Connection) -> datetime:
            with transaction(conn):
                now: datetime = conn.execute(select(db_now())).scalar_one()
                conn.execute(
                    insert(n).values(
                        node_id=node_id,
                        hostname=hostname,
                        pid=pid,
                        queues=",".join(queues),
                        concurrency=concurrency,
                        started_at=now,
                        heartbeat_ts=now,
                    )
                )
                return now

        registered: datetime = self._run(work, "the node was not registered")
        return registered

    def heartbeat(self, node_id: str) -> bool:
        """Refresh the node's heartbeat; False when the row is gone (declared dead)."""
        n = scheduler_node
        stmt = update(n).where(n.c.node_id == node_id).values(heartbeat_ts=db_now())
        return self._run(lambda conn: conn.execute(stmt).rowcount == 1, "no heartbeat was written")

    def set_node_queues(self, node_id: str, queues: Sequence[str]) -> None:
        n = scheduler_node
        stmt = update(n).where(n.c.node_id == node_id).values(queues=",".join(queues))
        self._run(lambda conn: conn.execute(stmt), "the node's queues were not recorded")

    def remove_node(self, node_id: str) -> None:
        n = scheduler_node
        self._run(
            lambda conn: conn.execute(delete(n).where(n.c.node_id == node_id)),
            "the node was not removed",
        )

    def node_heartbeats(self) -> dict[str, datetime]:
        """The last heartbeat of every registered node (by the database clock)."""
        n = scheduler_node
        stmt = select(n.c.node_id, n.c.heartbeat_ts)
        rows = self._run(lambda conn: conn.execute(stmt).all(), "heartbeats were not read")
        return {r.node_id: r.heartbeat_ts for r in rows}

    def recover_orphans(
        self,
        grace_seconds: float,
        *,
        observed: Mapping[str, datetime] | None = None,
        max_recoveries: int | None = None,
    ) -> OrphanRecovery:
        """Take the RUNNING jobs of dead nodes back, release their permits and delete the
        dead nodes, atomically.

        ``observed``: the nodes the caller watched stay silent for a full grace period, each
        with the heartbeat it saw; a node counts as dead only if its heartbeat still has that
        value (it did not beat since) and is older than ``grace_seconds`` by the database
        clock. Without it, every node silent for ``grace_seconds`` by the database clock is
        dead: only right for a caller that knows no node was cut off from the database.

        Jobs owned by no registered node (a node row removed by hand, a node that died while
        registering, a forged row with no owner) count as orphaned once their claim is older
        than the grace period, or has no time at all.

        A job a dead node held after more than ``max_recoveries`` claims since it was last
        scheduled (``claims``; hand-backs of live nodes count too) is not run again: it is
        FAILED, in the dead-letter queue, with an error that says so. The others (and every
        recurring master) are PENDING again.
        """
        n, p = scheduler_node, scheduler_resource_permit
        cutoff = db_now_minus(grace_seconds)
        silent = select(n.c.node_id, n.c.heartbeat_ts).where(n.c.heartbeat_ts < cutoff)
        if observed is not None:
            silent = silent.where(n.c.node_id.in_(list(observed)))
        if self.family != "sqlite":
            silent = silent.with_for_update(skip_locked=True)
        owned_by = job.c.picked_by.in_(bindparam("dead", expanding=True))
        unowned = and_(
            or_(job.c.picked_by.is_(None), job.c.picked_by.not_in(select(n.c.node_id))),
            or_(job.c.claimed_at.is_(None), job.c.claimed_at < cutoff),
        )

        def work(conn: Connection) -> OrphanRecovery:
            with transaction(conn):
                if observed is not None and not observed:
                    dead: list[str] = []
                else:
                    dead = [
                        r.node_id
                        for r in conn.execute(silent)
                        if observed is None or observed.get(r.node_id) == r.heartbeat_ts
                    ]
                running = job.c.status == JobStatus.RUNNING.value
                where = and_(running, or_(owned_by, unowned) if dead else unowned)
                params = {"dead": dead} if dead else {}
                found = select(job.c.job_id, job.c.claims, job.c.job_type).where(where)
                if self.family != "sqlite":  # (SQLite: the transaction holds the write lock)
                    # Locked as read: a settle racing this recovery waits for it, then finds
                    # the claim gone; the downstream effects below match the rows changed.
                    found = found.with_for_update()
                given_up = defaultdict(list)
                requeued = []
                for r in conn.execute(found, params):
                    # A recurring master is claimed at every fire time, and its firing is
                    # ratchet's own: its schedule is never given up.
                    master = r.job_type == JobType.RECURRING.value
                    if max_recoveries is not None and r.claims > max_recoveries and not master:
                        given_up[r.claims].append(r.job_id)
                    else:
                        requeued.append(r.job_id)
                if requeued:
                    conn.execute(
                        update(job)
                        .where(where, job.c.job_id.in_(requeued))
                        .values(status=JobStatus.PENDING.value, **_CLEARED_CLAIM),
                        params,
                    )
                dead_lettered = []
                for claims, ids in given_up.items():
                    error = recovery_limit_record(claims, max_recoveries or 0)
                    conn.execute(
                        update(job)
                        .where(where, job.c.job_id.in_(ids))
                        .values(
                            status=JobStatus.FAILED.value,
                            finished_at=db_now(),
                            last_error=error,
                            error_traceback=None,
                        ),
                        params,
                    )
                    cancel_downstream(conn, ids, error)
                    record_ended_parts(conn, ids, "FAILURE")
                    dead_lettered += ids
                if dead_lettered:
                    self._count_dead_letters(
                        conn, dlq_alerts.dead_letters_by_id(conn, dead_lettered)
                    )
                orphans = requeued + dead_lettered
                if orphans:
                    conn.execute(delete(p).where(p.c.job_id.in_(orphans)))
                if dead:
                    conn.execute(delete(p).where(p.c.node_id.in_(dead)))
                    conn.execute(delete(n).where(n.c.node_id.in_(dead)))
                return OrphanRecovery(sorted(requeued), sorted(dead_lettered), sorted(dead))

        return self._run(work, "orphaned jobs were not recovered")

    # -- dead-letter alerts -------------------------------------------------------------------

    def due_alert_windows(self, interval_seconds: float) -> list[str]:
        """Task names whose alert window has closed (by the database clock)."""
        return self._run(
            lambda conn: dlq_alerts.due_windows(conn, interval_seconds),
            "alert windows were not read",
        )

    def close_alert_window(
        self,
        task_name: str,
        interval_seconds: float,
        alert_job: Callable[[AlertWindow, list[str], datetime], NewJob],
    ) -> NewJob | None:
        """Close the task name's window if it is due and still open, inserting the alert job
        ``alert_job`` makes from it in the same transaction: once cluster-wide per window.
        None when there was nothing to close (not due, or closed by another node)."""

        def work(conn: Connection) -> NewJob | None:
            made: list[NewJob] = []

            def insert_alert(window: AlertWindow, job_ids: list[str], now: datetime) -> str:
                new = alert_job(window, job_ids, now)
                check_fields(new)
                conn.execute(self._insert, _params(new))
                made.append(new)
                return new.job_id

            with transaction(conn):
                closed = dlq_alerts.close_window(conn, task_name, interval_seconds, insert_alert)
            return made[0] if closed is not None else None

        return self._run(work, "the dead-letter alert was not sent")

    def alert_states(self, task_names: Sequence[str]) -> dict[str, dlq_alerts.AlertState]:
        return self._run(
            lambda conn: dlq_alerts.alert_states(conn, task_names), "alert states were not read"
        )

    def list_nodes(self) -> list[dict[str, Any]]:
        n = scheduler_node
        running = (
            select(func.count())
            .where(job.c.picked_by == n.c.node_id, job.c.status == JobStatus.RUNNING.value)
            .scalar_subquery()
        )
        stamps = ("started_at", "heartbeat_ts")
        columns = [_listed(c) if c.name in stamps else c for c in n.c]
        stmt = select(*columns, running.label("running")).order_by(n.c.started_at)
        rows = self._run(lambda conn: conn.execute(stmt).all(), "nodes were not listed")
        return [r._asdict() for r in rows]

    def queue_stats(self) -> dict[str, Any]:
        """Counts per (queue, status), jobs finished in the last minute, and per queue the
        age in seconds of its oldest due pending job, by the database clock. Recurring
        masters are schedules (``schedules``), not counted here."""
        by_queue = (
            select(job.c.queue, job.c.status, func.count())
            .where(_JOBS_ONLY)
            .group_by(job.c.queue, job.c.status)
        )
        finished = select(func.count()).where(
            job.c.status.in_(_TERMINAL), job.c.finished_at >= db_now_minus(60)
        )
        oldest = (
            select(job.c.queue, func.min(job.c.scheduled_time).label("due"))
            .where(
                _JOBS_ONLY,
                job.c.status == JobStatus.PENDING.value,
                job.c.scheduled_time <= db_now(),
            )
            .group_by(job.c.queue)
        )
        clock = select(db_now())

        def work(conn: Connection) -> dict[str, Any]:
            now = conn.execute(clock).scalar_one()
            return {
                "counts": [
                    {"queue": q, "status": st, "count": n} for q, st, n in conn.execute(by_queue)
                ],
                "finished_last_minute": conn.execute(finished).scalar_one(),
                "oldest_pending_seconds": {
                    q: round((now - due).total_seconds(), 3) for q, due in conn.execute(oldest)
                },
            }

        return self._run(work, "statistics were not read")

    def count_by_status(self) -> dict[str, int]:
        """Jobs per status; recurring masters are schedules, not jobs, and are not counted."""
        stmt = select(job.c.status, func.count()).where(_JOBS_ONLY).group_by(job.c.status)
        rows = self._run(lambda conn: conn.execute(stmt).all(), "jobs were not counted")
        return {status: count for status, count in rows}


def _best_first(claimed: list[ClaimedJob], boost_minutes: float) -> list[ClaimedJob]:
    """Dispatch order of one claimed batch: the claim's own order."""

    def key(j: ClaimedJob) -> tuple[int, datetime, int]:
        now = j.claimed_now or j.scheduled_time
        return (-effective_priority(j.priority, j.scheduled_time, now, boost_minutes),
                j.scheduled_time, j.id)  # fmt: skip

    return sorted(claimed, key=key)


def _insert_ignoring_duplicates(dialect: Any, table: Any, values: dict[str, Any]) -> Any:
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


def _group_by_outcome(params: list[dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    grouped: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for p in params:
        grouped[p["p_status"]].append((p["p_job_id"], p["p_token"]))
    return grouped


def _settled_values(status: JobStatus) -> dict[str, Any]:
    if status is JobStatus.PENDING:  # handed back: due again at once, for any node
        return {"status": status.value, **_CLEARED_CLAIM}
    return {"status": status.value, "finished_at": db_now()}


def _bytes(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _listed(column: Any) -> Any:
    """A timestamp column as a listing reads it: one unreadable value is not a failed list."""
    return type_coerce(column, ListedDateTime()).label(column.name)


def _summary(row: Any) -> JobSummary:
    values = row._asdict()
    values["status"] = parse_status(values["status"])
    return JobSummary(**values)
