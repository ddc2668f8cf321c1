"""Exceptions raised by celery_ratchet. Each message says what happened and what to do."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class RatchetError(Exception):
    """Base class of every celery_ratchet error.

    An error whose message is made from fields (its constructor takes them) keeps the fields
    as its ``args`` and tells its message as ``str()``: Celery rebuilds a task's failure from
    its stored form as ``cls(*args)``, and pickle rebuilds it from the same, so a rebuilt error
    is the error it was, not one that takes its own message for its first field."""

    _message: str | None = None

    def _made_of(self, message: str, *fields: Any) -> None:
        Exception.__init__(self, *fields)
        self._message = message

    def __str__(self) -> str:
        return self._message if self._message is not None else super().__str__()

    def __reduce__(self) -> Any:
        if self._message is not None:
            return (type(self), self.args)
        return super().__reduce__()


def rebuilt_message(exc_type: str, module: str | None, args: Sequence[Any]) -> str | None:
    """The message of one of these errors, rebuilt from its stored type and ``args`` (Celery's
    JSON form of a failure); None for any other exception."""
    kind = globals().get(exc_type) if module == __name__ else None
    if not (isinstance(kind, type) and issubclass(kind, RatchetError)):
        return None
    try:
        return str(kind(*args))
    except Exception:
        return None


class ConfigurationError(RatchetError, ValueError):
    """A setting or environment variable has a value celery_ratchet cannot use."""


class StoreUnavailable(RatchetError, ConnectionError):
    """The job store (the database) could not be reached.

    ``outcome_unknown`` is False when nothing reached the database (nothing was written), True
    when the connection was lost after a statement was sent: it may have been committed."""

    outcome_unknown: bool = False


class StoreFull(StoreUnavailable):
    """The job store's server has no space left (its disk is full): it refused the statement,
    and nothing of it was written. An outage for the store: a worker keeps what it could not
    write and tries again; a send raises this once its publish retries are spent."""


class StorePermissionDenied(StoreUnavailable):
    """The job store's database user lacks a privilege a statement needs (INSERT, UPDATE,
    DELETE on a ratchet table): the database refused it, and nothing of it was written. For
    a worker an outage like a full disk: what it could not write is kept and tried again,
    and goes through once an administrator grants the privilege."""


class SchemaOutdated(RatchetError):
    """The job store's tables predate this version in a way that cannot be fixed in place."""


class SchemaNotCreated(RatchetError):
    """The database user may not create celery_ratchet's tables, and they are not there."""


class PreparedStatementConflict(ConfigurationError):
    """PostgreSQL refused a server-side prepared statement: the connection goes through a
    pooler in transaction mode (PgBouncer), which cannot keep them."""


class StoreBusy(RatchetError):
    """The database kept refusing a statement for lock conflicts (deadlocks, lock timeouts)."""


class StatementCancelled(StoreBusy):
    """The database ended a statement before it finished: a server limit on statement time
    (PostgreSQL ``statement_timeout``, MySQL ``max_execution_time``, MariaDB
    ``max_statement_time``) or an operator's cancel. Nothing of it was committed."""


class TransactionRolledBack(StoreBusy):
    """A send in the caller's own transaction (``celery_ratchet.transaction()``, a Django
    ``atomic()`` block) made the database roll that whole transaction back (MySQL/MariaDB do
    so to end a deadlock): nothing written in it stands; run the transaction again."""


class PayloadTooLarge(RatchetError, ValueError):
    """A job's serialized arguments exceed ``ratchet_max_payload_kb``."""

    def __init__(self, task_name: str, size_bytes: int, limit_kb: int) -> None:
        self.task_name = task_name
        self.size_bytes = size_bytes
        self.limit_kb = limit_kb
        self._made_of(
            f"payload of task {task_name!r} is {size_bytes / 1024:.1f} KB, over the limit of "
            f"{limit_kb} KB (ratchet_max_payload_kb); pass a reference instead of the data "
            f"(a primary key, a file path, an object-store key)",
            task_name,
            size_bytes,
            limit_kb,
        )


class MessageTooLarge(PayloadTooLarge):
    """A job's whole message, with the workflow Celery embeds in it, is larger than a row
    holds on every database."""

    def __init__(self, task_name: str, size_bytes: int, limit_bytes: int) -> None:
        self.task_name = task_name
        self.size_bytes = size_bytes
        self.limit_kb = limit_bytes // 1024
        self._made_of(
            f"message of task {task_name!r} is {size_bytes / 2**20:.1f} MB with its headers "
            "and the workflow Celery carries in it (the rest of a chain, a chord's header, "
            "callbacks), over "
            f"the {limit_bytes / 2**20:.0f} MB a job row holds; send a large chord on its own "
            "rather than inside a chain, or pass references instead of data",
            task_name,
            size_bytes,
            limit_bytes,
        )


class CompressedPayloadTooLarge(PayloadTooLarge):
    """A job's compressed payload decompresses to more than a worker takes: 64 times
    ``ratchet_max_payload_kb`` (``limit_bytes``)."""

    def __init__(self, task_name: str, limit_bytes: int, limit_kb: int) -> None:
        self.task_name = task_name
        self.size_bytes = limit_bytes + 1  # at least: decompression stops there
        self.limit_kb = limit_kb
        self._made_of(
            f"the payload of task {task_name!r} decompresses to more than "
            f"{limit_bytes // 1024} KB, {limit_bytes // (limit_kb * 1024)} times "
            f"ratchet_max_payload_kb = {limit_kb}; pass a reference instead of the data, or "
            "raise ratchet_max_payload_kb on senders and workers alike",
            task_name,
            limit_bytes,
            limit_kb,
        )


class DuplicateJob(RatchetError):
    """A job with this task id is already pending or running; or, with ``business_key``
    set, the job's business key is held by an active job (PENDING, WAITING or RUNNING),
    whose id is ``job_id``. Nothing was written.

    The key itself is kept in ``business_key`` only: the fields the error is stored and
    rebuilt from (``args``) say ``HELD`` in its place."""

    #: What a rebuilt DuplicateJob has for the business key it does not carry.
    HELD = "held"

    def __init__(
        self, job_id: str, business_key: str | None = None, reason: str | None = None
    ) -> None:
        self.job_id = job_id
        self.business_key = business_key
        if business_key is None:
            message = (
                f"a job with task id {job_id!r} is already pending or running; "
                f"use a new task_id, or revoke the existing job first"
            )
        else:
            # The key itself stays out of the message: it is often made of the job's data.
            message = (
                f"the business key of this job is held by active job {job_id!r} (PENDING, "
                f"WAITING or RUNNING), so no second job was created; "
                + (reason or "use AsyncResult(job_id) to follow that one, or revoke it first")
            )
        self._made_of(message, job_id, None if business_key is None else self.HELD, reason)


class SerializerNotAllowed(RatchetError, ValueError):
    """A serializer other than json was asked for without explicit permission."""

    def __init__(self, serializer: str) -> None:
        self.serializer = serializer
        self._made_of(
            f"serializer {serializer!r} is refused: celery_ratchet stores json; set "
            f"ratchet_allow_pickle = True (env RATCHET_ALLOW_PICKLE=true) only if every "
            f"process that can write to the job store is trusted",
            serializer,
        )


class UnsupportedRouting(RatchetError, ValueError):
    """A routing feature of AMQP brokers that a database queue cannot honour."""


class MalformedJob(RatchetError):
    """A stored job row that cannot be run as it is (written by hand or by another tool): it
    was failed without running; the message says what is wrong with the row."""


class InvalidJob(RatchetError, ValueError):
    """A job's field or option has a value the job store cannot hold or ratchet cannot
    honour; nothing was written. ``field`` names it; the message gives the limit."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self._made_of(message, field, message)


class InvalidArgument(RatchetError, ValueError):
    """An operation's argument (not a job's) that ratchet cannot take; nothing was written.
    ``field`` names it; the message gives the limit and what to do."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self._made_of(message, field, message)


class ValueRefused(RatchetError, ValueError):
    """The database refused a value (too long, out of range, bad text); nothing was written.
    The message carries the database's reason, never the statement's parameters."""


class StatementTooLarge(ValueRefused):
    """A statement larger than the database server takes (MySQL/MariaDB's
    ``max_allowed_packet``), a job's result say; nothing was written, and sending it again
    cannot help. The message names the limit and the setting."""


class SchemaMissing(RatchetError):
    """The database has no job-store tables (or not all of them): nothing was read or written."""


class PredicateNotAllowed(RatchetError, ValueError):
    """A workflow condition names a function the application did not allow."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._made_of(
            f"predicate {path!r} is not allowed: decorate the function with "
            f"@celery_ratchet.predicate (in a module the worker imports), or list its package "
            f"in ratchet_predicate_modules; a workflow condition never runs any other function",
            path,
        )


class WorkflowError(RatchetError, ValueError):
    """A workflow that cannot be stored as given (bad predicate, unknown join name)."""


class RecoveryLimitExceeded(RatchetError):
    """Orphan recovery took a job back from dead nodes more often than
    ``ratchet_max_recoveries`` allows: it is FAILED, in the dead-letter queue."""


class ControlCommandRefused(RatchetError, ValueError):
    """A remote control command that cannot travel through the job store (its arguments are
    not JSON)."""


class StreamAbandoned(RatchetError):
    """A streaming batch was failed while its producer was still writing it: the producer's
    lease ran out between two chunks (``ratchet_batch_stream_lease_seconds``), or the batch
    was failed by hand. Nothing more was written to it."""

    def __init__(self, batch_id: str, lease_seconds: float | None = None) -> None:
        self.batch_id = batch_id
        held = f" ({lease_seconds:g} s)" if lease_seconds is not None else ""
        self._made_of(
            f"batch {batch_id} is no longer open: it was failed while its stream was being "
            f"written, most likely because no chunk arrived within its lease{held}; raise "
            "ratchet_batch_stream_lease_seconds (or stream(..., lease_seconds=...)) if the "
            "iterator can take longer than that between two items",
            batch_id,
            lease_seconds,
        )


class ImportLockLost(RatchetError):
    """An ``import-broker`` run lost its lock on a Redis database (stopped or cut off from
    Redis for longer than the lock lives) and another run took over: it stopped without
    changing the broker again."""
