"""The one definition of the database schema; ``ddl/*.sql`` is generated from it."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

from celery_ratchet.domain.job import UNREADABLE, Unreadable

metadata = MetaData()

_MYSQL = ("mysql", "mariadb")


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in Python: ``timestamptz`` on PostgreSQL, UTC ``DATETIME(6)`` on
    MySQL/MariaDB, ISO text on SQLite."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name in _MYSQL:
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=dialect.name == "postgresql"))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r} given to the job store; pass aware UTC")
        value = value.astimezone(timezone.utc)
        return value if dialect.name == "postgresql" else value.replace(tzinfo=None)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        # SQLite's clock expression yields text
        moment: datetime = datetime.fromisoformat(value) if isinstance(value, str) else value
        if moment.tzinfo is None:
            return moment.replace(tzinfo=timezone.utc)
        return moment.astimezone(timezone.utc)


class KeptDateTime(UTCDateTime):
    """:class:`UTCDateTime` for the rows of a claim: a value that is no timestamp is kept as
    it was read, so that the claim fails that row alone and says what it holds. SQLite's
    text column can hold one, MySQL/MariaDB their zero date (which PyMySQL reads as text),
    PostgreSQL its infinities and years before 1 or after 9999 (read as the server's text:
    see ``store/pg_timestamps.py``)."""

    cache_ok = True

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        try:
            return super().process_result_value(value, dialect)
        except (AttributeError, TypeError, ValueError):
            return value


class ListedDateTime(TypeDecorator[Any]):
    """:class:`UTCDateTime` for listings (``type_coerce`` in a select): a value that is no
    timestamp (see :class:`KeptDateTime`) reads as
    :data:`~celery_ratchet.domain.job.UNREADABLE` instead of failing the whole listing."""

    impl = DateTime(timezone=True)
    cache_ok = True
    _stamp = UTCDateTime()

    def load_dialect_impl(self, dialect: Dialect) -> Any:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String())  # parsed here, where a failure is caught
        return self._stamp.load_dialect_impl(dialect)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | Unreadable | None:
        try:
            return self._stamp.process_result_value(value, dialect)
        except (ValueError, TypeError):
            return UNREADABLE


def _long_text() -> Any:
    return Text().with_variant(mysql.MEDIUMTEXT(), *_MYSQL)


def _blob() -> Any:
    return LargeBinary().with_variant(mysql.MEDIUMBLOB(), *_MYSQL)


def _job_columns() -> list[Column[Any]]:
    return [
        Column("job_id", String(255), nullable=False),
        Column("task_name", String(255), nullable=False),
        Column("queue", String(255), nullable=False),
        Column("status", String(16), nullable=False),
        Column("job_type", String(24), nullable=False, server_default="SINGLE"),
        Column("priority", SmallInteger, nullable=False),
        Column("scheduled_time", UTCDateTime, nullable=False),
        Column("created_at", UTCDateTime, nullable=False),
        Column("expires_at", UTCDateTime),
        Column("attempts", Integer, nullable=False, server_default="0"),
        Column("claims", Integer, nullable=False, server_default="0"),
        Column("root_id", String(255)),
        Column("parent_id", String(255)),
        Column("group_id", String(255)),
        #: A chain step: the job whose success releases it (it waits as ``WAITING`` until then).
        Column("depends_on", String(255)),
        Column("business_key", String(255)),
        Column("schedule_spec", Text),
        Column("resource", String(255)),
        #: ``,tag1,tag2,`` so one LIKE finds a tag.
        Column("tags", Text),
        #: Revoke asked while the job was RUNNING: ``REVOKE``, or the signal to terminate it.
        Column("revoke_requested", String(16)),
        #: The node holding the claim (RUNNING). On a PENDING row, the node it was handed to
        #: by one that claimed it without knowing its task (``store/task_handoff.py``): no
        #: other node claims it while that node is registered.
        Column("picked_by", String(255)),
        Column("claim_token", String(32)),
        Column("claimed_at", UTCDateTime),
        Column("started_at", UTCDateTime),
        Column("finished_at", UTCDateTime),
        Column("payload", _blob(), nullable=False),
        Column("content_type", String(128), nullable=False),
        Column("content_encoding", String(64), nullable=False),
        Column("headers", _long_text(), nullable=False),
        Column("properties", Text, nullable=False),
        Column("job_result", _long_text()),
        Column("result_type", String(255)),
        Column("result_meta", _long_text()),
        Column("last_error", _long_text()),
        Column("error_traceback", _long_text()),
    ]


_id_type = BigInteger().with_variant(Integer, "sqlite")
# Binary collation: task ids and queue names are case-sensitive strings, as in Celery. Written
# after CREATE TABLE by ddl.table_statements, in one order on every SQLAlchemy release (2.0
# and 2.1 order the mysql_* table options differently).
MYSQL_TABLE_OPTIONS = "ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin"
_MYSQL_OPTIONS: dict[str, Any] = {"info": {"mysql_options": MYSQL_TABLE_OPTIONS}}

scheduler_job = Table(
    "scheduler_job",
    metadata,
    Column("id", _id_type, primary_key=True, autoincrement=True),
    *_job_columns(),
    # Nothing reads back an inserted row's id; RETURNING it would cost every enqueue.
    implicit_returning=False,
    # Every job is inserted and updated a few times: vacuum early, so claims do not wade
    # through dead index entries; and leave room in each page, so that a job's new version
    # (its claim, its end) is written beside the old one, where PostgreSQL logs only the
    # bytes that changed: on another page it logs the whole row (payload, headers and
    # properties) and a lock of the old one. Rendered by ddl.table_statements (SQLAlchemy
    # 2.0 has no ``postgresql_with`` table option; 2.1 does); a table an earlier version
    # made is given a parameter it lacks by ddl.add_storage_parameters.
    info={
        "mysql_options": MYSQL_TABLE_OPTIONS,
        "postgresql_with": {
            "fillfactor": "70",
            "autovacuum_vacuum_scale_factor": "0.02",
            "autovacuum_vacuum_insert_scale_factor": "0.05",
            "autovacuum_analyze_scale_factor": "0.02",
        },
    },
)

Index("ux_scheduler_job_job_id", scheduler_job.c.job_id, unique=True)

# The claim reads pending rows of a queue level by level (priority, then due time): partial
# indexes hold only pending rows where the dialect has them, one for jobs without a resource
# and one for jobs that need a permit. MySQL/MariaDB lead with status and resource instead.


def _ready_index(name: str, where: str, *leading: Any) -> Index:
    return Index(
        name,
        *leading,
        scheduler_job.c.queue,
        scheduler_job.c.priority.desc(),
        scheduler_job.c.scheduled_time,
        scheduler_job.c.id,
        postgresql_where=text(where),
        sqlite_where=text(where),
        info={"dialects": ("postgresql", "sqlite")},
    )


_ready_index("ix_scheduler_job_ready", "status = 'PENDING' AND resource IS NULL")
_ready_index(
    "ix_scheduler_job_ready_resource",
    "status = 'PENDING' AND resource IS NOT NULL",
    scheduler_job.c.resource,
)
Index(
    "ix_scheduler_job_ready_status",
    scheduler_job.c.status,
    scheduler_job.c.resource,
    scheduler_job.c.queue,
    scheduler_job.c.priority.desc(),
    scheduler_job.c.scheduled_time,
    scheduler_job.c.id,
    info={"dialects": _MYSQL},
)
# Orphan recovery and node listings look up running rows by owner.
Index(
    "ix_scheduler_job_owner",
    scheduler_job.c.status,
    scheduler_job.c.picked_by,
)


def _index_where(name: str, where: str, *columns: Any) -> Index:
    """An index of the rows ``where`` holds, where the dialect has partial indexes; of every
    row on MySQL/MariaDB. Every index of a row is written again at each status change (the
    status is indexed, so no update is a heap-only one): rows that no query of this index
    can ask for are left out of it. Each query it serves compares its columns with an
    operator that is false for NULL, which is how PostgreSQL and SQLite know the index holds
    every row the query can match, bound parameters included."""
    return Index(name, *columns, postgresql_where=text(where), sqlite_where=text(where))


# Purges, the dashboard's throughput and dead-letter alerts look up finished rows by time.
_index_where(
    "ix_scheduler_job_finished",
    "finished_at IS NOT NULL",
    scheduler_job.c.status,
    scheduler_job.c.finished_at,
)
# A failed chain step cancels the steps waiting on it; batch listings count their children.
_index_where("ix_scheduler_job_depends_on", "depends_on IS NOT NULL", scheduler_job.c.depends_on)
_index_where(
    "ix_scheduler_job_group",
    "group_id IS NOT NULL",
    scheduler_job.c.group_id,
    scheduler_job.c.status,
)

# Business keys are unique among active jobs: one PENDING, WAITING or RUNNING job per key,
# held by the database so that concurrent sends of a key make one job. Recurring masters
# are left out: their job id (from their key) makes them unique already, and an ordinary
# job may share a schedule's name. PostgreSQL and SQLite: a partial unique index.
ACTIVE_KEY_STATUSES = ("PENDING", "WAITING", "RUNNING")
ACTIVE_KEY_WHERE = (
    "business_key IS NOT NULL AND status IN ('PENDING', 'WAITING', 'RUNNING') "
    "AND job_type <> 'RECURRING'"
)
ACTIVE_KEY_INDEX = "ux_scheduler_job_active_key"
Index(
    ACTIVE_KEY_INDEX,
    scheduler_job.c.business_key,
    unique=True,
    postgresql_where=text(ACTIVE_KEY_WHERE),
    sqlite_where=text(ACTIVE_KEY_WHERE),
    info={"dialects": ("postgresql", "sqlite")},
)
#: MySQL/MariaDB have no partial index: a stored generated column holds the key while the job
#: is active (NULL otherwise, and NULLs never collide), with a unique index on it. Not a
#: column of the table above: it exists on MySQL/MariaDB only (see ddl.table_statements).
MYSQL_ACTIVE_KEY_COLUMN = "active_business_key"
MYSQL_ACTIVE_KEY_DEFINITION = (
    f"{MYSQL_ACTIVE_KEY_COLUMN} VARCHAR(255) GENERATED ALWAYS AS "
    f"(CASE WHEN {ACTIVE_KEY_WHERE} THEN business_key END) STORED"
)

scheduler_job_archive = Table(
    "scheduler_job_archive",
    metadata,
    Column("id", _id_type, primary_key=True, autoincrement=False),
    *_job_columns(),
    Column("archived_at", UTCDateTime, nullable=False),
    **_MYSQL_OPTIONS,
)
Index("ix_scheduler_job_archive_job_id", scheduler_job_archive.c.job_id)
Index("ix_scheduler_job_archive_finished", scheduler_job_archive.c.finished_at)

scheduler_node = Table(
    "scheduler_node",
    metadata,
    Column("node_id", String(255), primary_key=True),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("queues", Text, nullable=False),
    Column("concurrency", Integer, nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("heartbeat_ts", UTCDateTime, nullable=False),
    # The business keys of the schedules the node's configuration owns (its beat_schedule's
    # entries), as a JSON list: one is removed only once no live node's list has it. NULL:
    # not said (a node of an earlier version), so nothing is removed while it lives.
    Column("schedule_keys", Text, nullable=True),
    # The names of the tasks the node has registered, as a JSON list: a node that claims a
    # job of a task it does not know hands it to a live node whose list has it (a rolling
    # deploy). NULL: not said (a node of an earlier version), so none is handed to it.
    # MEDIUMTEXT on MySQL/MariaDB: TEXT holds 64 KB, which the names of some 1,000 tasks fill,
    # and a node whose list does not fit could not register at all.
    Column("task_names", _long_text(), nullable=True),
    **_MYSQL_OPTIONS,
)

# One row per resource: claims of that resource lock it, so two nodes never both take the
# last permit. ``capacity`` is what the last claiming node was configured with.
scheduler_resource = Table(
    "scheduler_resource",
    metadata,
    Column("resource", String(255), primary_key=True),
    Column("capacity", Integer, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    **_MYSQL_OPTIONS,
)

# A permit counts while its job is still RUNNING under the same claim: however a job ends
# (or is taken from a dead node), a permit left behind can never block the resource.
scheduler_resource_permit = Table(
    "scheduler_resource_permit",
    metadata,
    Column("resource", String(255), primary_key=True),
    Column("job_id", String(255), primary_key=True),
    Column("node_id", String(255), nullable=False),
    Column("acquired_at", UTCDateTime, nullable=False),
    Column("claim_token", String(32)),
    **_MYSQL_OPTIONS,
)

# Lines a task wrote with celery_ratchet.job_logger(), kept ratchet_log_retention_days.
scheduler_job_log = Table(
    "scheduler_job_log",
    metadata,
    Column("id", _id_type, primary_key=True, autoincrement=True),
    Column("job_id", String(255), nullable=False),
    Column("logged_at", UTCDateTime, nullable=False),
    Column("level", String(16), nullable=False),
    Column("message", _long_text(), nullable=False),
    **_MYSQL_OPTIONS,
)
Index("ix_scheduler_job_log_job", scheduler_job_log.c.job_id, scheduler_job_log.c.id)
Index("ix_scheduler_job_log_logged_at", scheduler_job_log.c.logged_at)

scheduler_group_result = Table(
    "scheduler_group_result",
    metadata,
    Column("group_id", String(255), primary_key=True),
    Column("result", _long_text(), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    **_MYSQL_OPTIONS,
)

# A batch: a Celery group or chord, or a batch built with celery_ratchet.batch(). The row does
# no work; it tracks its children and completes exactly once, decided by a compare-and-swap
# on ``state`` (OPEN → SUCCEEDED | FAILED) in the transaction that sends what follows it.
scheduler_batch = Table(
    "scheduler_batch",
    metadata,
    Column("batch_id", String(255), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("name", String(255)),
    Column("state", String(16), nullable=False),
    #: Children expected; ``None`` for a plain group (its children rows are counted instead).
    Column("total", Integer),
    #: Children added while running (``self.replace()`` inside a chord, ``add_to_chord``).
    Column("added", Integer, nullable=False, server_default="0"),
    #: Children finished, and how many of them failed: counted as their parts are written.
    Column("done", Integer, nullable=False, server_default="0"),
    Column("failed", Integer, nullable=False, server_default="0"),
    #: A streaming batch: children written so far (``total`` stays NULL until its stream
    #: ended), and until when its producer holds it (database clock), renewed per chunk;
    #: an open stream whose lease ran out lost its producer and is failed by housekeeping.
    Column("written", Integer, nullable=False, server_default="0"),
    Column("lease_until", UTCDateTime),
    #: Progress reports (``on_progress``), one per whole percent reached: the percent up to
    #: which they are written, and up to which they have run (each is held until the one
    #: before it ended, so they run one at a time, in order).
    Column("progress_written", SmallInteger, nullable=False, server_default="0"),
    Column("progress_ended", SmallInteger, nullable=False, server_default="0"),
    #: JSON signatures: the chord body (``on_success`` of a batch), and a batch's others.
    Column("on_success", _long_text()),
    Column("on_failure", _long_text()),
    Column("on_progress", _long_text()),
    Column("created_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
    **_MYSQL_OPTIONS,
)
Index(
    "ix_scheduler_batch_state",
    scheduler_batch.c.state,
    scheduler_batch.c.kind,
    scheduler_batch.c.created_at,
)

# One row per child that finished, written with the child's own outcome: a child run twice
# (recovered from a dead node) still counts once.
scheduler_batch_part = Table(
    "scheduler_batch_part",
    metadata,
    Column("batch_id", String(255), primary_key=True),
    Column("job_id", String(255), primary_key=True),
    Column("position", Integer),
    Column("state", String(16), nullable=False),
    #: Celery's encoded result, or exception record for a failure.
    Column("result", _long_text()),
    Column("finished_at", UTCDateTime, nullable=False),
    **_MYSQL_OPTIONS,
)

# A workflow's branches: evaluated in ``position`` order when the parent job completes, each
# fired or skipped once (``state`` WAITING → FIRED | SKIPPED).
scheduler_workflow_condition = Table(
    "scheduler_workflow_condition",
    metadata,
    Column("parent_id", String(255), primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    #: SUCCESS, FAILURE, RESULT (``predicate`` decides) or JOIN (after the named branches).
    Column("kind", String(16), nullable=False),
    Column("name", String(255)),
    Column("predicate", String(512)),
    #: For a JOIN: the names of the branches it waits for, comma-separated.
    Column("waits_for", Text),
    Column("branch", _long_text(), nullable=False),
    Column("state", String(16), nullable=False),
    Column("decided_at", UTCDateTime),
    **_MYSQL_OPTIONS,
)

# Dead-letter alerts (the seeds' DLQ_ALERT): one row per task name. ``opened_at`` is the open
# window (the finish time of its first failed job; NULL: none open) and ``failed`` what it
# counted, both changed in the transaction that fails each job; the window is closed, and
# its alert job inserted, by one compare-and-swap on ``alerts_sent``.
scheduler_dlq_alert = Table(
    "scheduler_dlq_alert",
    metadata,
    Column("task_name", String(255), primary_key=True),
    Column("opened_at", UTCDateTime),
    Column("failed", Integer, nullable=False, server_default="0"),
    Column("newest_job_id", String(255)),
    Column("newest_error", _long_text()),
    Column("newest_at", UTCDateTime),
    #: When the first window of this task name opened: dead letters before it had no alert.
    Column("first_opened_at", UTCDateTime),
    Column("alerts_sent", Integer, nullable=False, server_default="0"),
    Column("last_sent_at", UTCDateTime),
    Column("last_alert_id", String(255)),
    Column("last_count", Integer),
    **_MYSQL_OPTIONS,
)
# Remote control (``celery inspect``/``celery control``) without a broker: a broadcast is one
# row here, read by every worker's main process until it expires (by the database clock).
scheduler_control = Table(
    "scheduler_control",
    metadata,
    Column("id", _id_type, primary_key=True, autoincrement=True),
    Column("command", String(255), nullable=False),
    #: JSON object of keyword arguments.
    Column("arguments", _long_text(), nullable=False),
    #: JSON list of node names; NULL addresses every worker (or those ``pattern`` matches).
    Column("destination", Text),
    Column("pattern", String(255)),
    Column("matcher", String(64)),
    #: Where replies go; NULL when the sender wants none.
    Column("ticket", String(64)),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    implicit_returning=False,
    **_MYSQL_OPTIONS,
)
Index("ix_scheduler_control_expires", scheduler_control.c.expires_at)

# One row per node that answered a broadcast; the sender reads and deletes them.
scheduler_control_reply = Table(
    "scheduler_control_reply",
    metadata,
    Column("id", _id_type, primary_key=True, autoincrement=True),
    Column("ticket", String(64), nullable=False),
    Column("hostname", String(255), nullable=False),
    #: JSON: ``{hostname: reply}``, as a worker's mailbox replies.
    Column("reply", _long_text(), nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    implicit_returning=False,
    **_MYSQL_OPTIONS,
)
Index(
    "ix_scheduler_control_reply_ticket",
    scheduler_control_reply.c.ticket,
    scheduler_control_reply.c.id,
)
Index("ix_scheduler_control_reply_expires", scheduler_control_reply.c.expires_at)

# Paused queues: a queue with a row here is claimed by no worker until the row is deleted.
# Jobs are still accepted into it; workers re-read the table before they claim.
scheduler_queue_pause = Table(
    "scheduler_queue_pause",
    metadata,
    Column("queue", String(255), primary_key=True),
    Column("paused_at", UTCDateTime, nullable=False),
    #: Who paused it and why, as given (``ratchet queues pause --reason``); NULL: not said.
    Column("reason", String(255)),
    **_MYSQL_OPTIONS,
)
