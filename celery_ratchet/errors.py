"""Exceptions raised by celery_ratchet. Each message says what happened and what to do."""

from __future__ import annotations


class RatchetError(Exception):
    """Base class of every celery_ratchet error."""


class ConfigurationError(RatchetError, ValueError):
    """A setting or environment variable has a value celery_ratchet cannot use."""


class StoreUnavailable(RatchetError, ConnectionError):
    """The job store (the database) could not be reached; nothing was written."""


class SchemaOutdated(RatchetError):
    """The job store's tables predate this version in a way that cannot be fixed in place."""


class SchemaNotCreated(RatchetError):
    """The database user may not create celery_ratchet's tables, and they are not there."""


class StoreBusy(RatchetError):
    """The database kept refusing a statement for lock conflicts (deadlocks, lock timeouts)."""


class PayloadTooLarge(RatchetError, ValueError):
    """A job's serialized arguments exceed ``ratchet_max_payload_kb``."""

    def __init__(self, task_name: str, size_bytes: int, limit_kb: int) -> None:
        self.task_name = task_name
        self.size_bytes = size_bytes
        self.limit_kb = limit_kb
        super().__init__(
            f"payload of task {task_name!r} is {size_bytes / 1024:.1f} KB, over the limit of "
            f"{limit_kb} KB (ratchet_max_payload_kb); pass a reference instead of the data "
            f"(a primary key, a file path, an object-store key)"
        )


class DuplicateJob(RatchetError):
    """A job with this task id is already pending or running."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        super().__init__(
            f"a job with task id {job_id!r} is already pending or running; "
            f"use a new task_id, or revoke the existing job first"
        )


class SerializerNotAllowed(RatchetError, ValueError):
    """A serializer other than json was asked for without explicit permission."""

    def __init__(self, serializer: str) -> None:
        self.serializer = serializer
        super().__init__(
            f"serializer {serializer!r} is refused: celery_ratchet stores json; set "
            f"ratchet_allow_pickle = True (env RATCHET_ALLOW_PICKLE=true) only if every "
            f"process that can write to the job store is trusted"
        )


class UnsupportedRouting(RatchetError, ValueError):
    """A routing feature of AMQP brokers that a database queue cannot honour."""
