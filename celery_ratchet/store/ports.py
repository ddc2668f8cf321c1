"""What the runtime asks of the job store, one Protocol per concern.

:class:`~celery_ratchet.store.jobstore.JobStore` implements all of them on a database, and
:class:`~celery_ratchet.store.memory.MemoryStore` in memory (mypy checks both; the contract
suite, tests/contract, runs on both); the runtime depends on these, not on a class, so a
store with another shape only has to keep them. They import no SQLAlchemy (pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from celery_ratchet.domain.control import ControlCommand, ControlReply
from celery_ratchet.domain.dlq_alert import AlertState, AlertWindow
from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    JobSummary,
    NewJob,
    ResultRecord,
    Settlement,
)
from celery_ratchet.domain.queue_pause import PausedQueue
from celery_ratchet.domain.recovery import OrphanRecovery


class Announcing(Protocol):
    #: The store's URL with its password masked, for messages.
    display_url: str

    def announce(self, word: str) -> None:
        """Wake the idle workers listening for ``word`` (a queue, or a wake-up word)."""


class QueueStore(Announcing, Protocol):
    """Jobs claimed, put off and settled."""

    def claim(self, node_id: str, queues: Sequence[str], limit: int) -> list[ClaimedJob]: ...

    def claim_for_resource(
        self, node_id: str, queues: Sequence[str], resource: str, capacity: int, limit: int
    ) -> list[ClaimedJob]: ...

    def defer(self, deferrals: Sequence[tuple[str, str, datetime]]) -> int: ...

    def hand_to(self, handoffs: Sequence[tuple[str, str, str]]) -> int:
        """Claimed jobs, each as (job id, claim token, node id), back PENDING for that node
        alone to claim (``store/task_handoff.py``)."""

    def settle(
        self,
        settlements: Iterable[Settlement],
        *,
        lock_wait: float | None = None,
        retry_conflicts: bool = True,
    ) -> int: ...

    def next_due_in(self, queues: Sequence[str], node_id: str | None = None) -> float | None: ...

    def paused_queues(self) -> dict[str, PausedQueue]:
        """The queues an operator paused, which no node claims from."""

    def running_claims(
        self, node_id: str, *, older_than_seconds: float
    ) -> list[tuple[str, str]]: ...

    def result(self, job_id: str) -> ResultRecord | None: ...


class NodeStore(Protocol):
    """Worker nodes: registration, heartbeats, and recovery of the jobs of dead ones."""

    def register_node(
        self,
        node_id: str,
        hostname: str,
        pid: int,
        queues: Sequence[str],
        concurrency: int,
        schedule_keys: Sequence[str] | None = None,
        task_names: Sequence[str] | None = None,
    ) -> datetime: ...

    def node_schedule_keys(self) -> dict[str, list[str] | None]: ...

    def heartbeat(self, node_id: str) -> bool: ...

    def database_time(self) -> datetime | None: ...

    def set_node_queues(self, node_id: str, queues: Sequence[str]) -> None: ...

    def remove_node(self, node_id: str) -> None: ...

    def node_heartbeats(self) -> dict[str, datetime]: ...

    def recover_orphans(
        self,
        grace_seconds: float,
        *,
        observed: Mapping[str, datetime] | None = None,
        max_recoveries: int | None = None,
    ) -> OrphanRecovery: ...


class RevocationStore(Protocol):
    """Revokes asked of the running jobs of a node."""

    def revocations(self, node_id: str) -> list[tuple[str, str, str]]: ...


class ScheduleStore(QueueStore, Protocol):
    """Recurring masters: registered, fired, paused and resumed."""

    def upsert_master(self, master: NewJob) -> str: ...

    def list_masters(self, *, include_cancelled: bool = False) -> list[dict[str, Any]]: ...

    def set_master_status(
        self, job_id: str, status: JobStatus, *, due: datetime | None = None
    ) -> bool: ...

    def run_master_now(self, job_id: str) -> bool: ...

    def fire_master(
        self, master: ClaimedJob, occurrences: Sequence[NewJob], next_due: datetime | None
    ) -> bool: ...

    def fire_masters(
        self, firings: Sequence[tuple[ClaimedJob, Sequence[NewJob], datetime | None]]
    ) -> list[bool]: ...


class DeadLetterStore(Protocol):
    """Jobs that failed for good: listed, retried, purged, and alerted on."""

    def result(self, job_id: str) -> ResultRecord | None: ...

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
    ) -> list[JobSummary]: ...

    def retry_failed(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        task_name: str | None = None,
        queue: str | None = None,
        rewrite_headers: Callable[[str], str] = ...,
    ) -> int: ...

    def purge_failed(
        self,
        job_ids: Sequence[str] | None = None,
        *,
        task_name: str | None = None,
        queue: str | None = None,
    ) -> int: ...

    def due_alert_windows(self, interval_seconds: float) -> list[str]: ...

    def close_alert_window(
        self,
        task_name: str,
        interval_seconds: float,
        alert_job: Callable[[AlertWindow, list[str], datetime], NewJob],
    ) -> NewJob | None: ...

    def alert_states(self, task_names: Sequence[str]) -> dict[str, AlertState]: ...


class WorkerStore(ScheduleStore, NodeStore, RevocationStore, Protocol):
    """Everything a worker's runtime uses."""


class ControlCommands(Protocol):
    """Remote control broadcasts as a worker reads and answers them."""

    def commands_since(self, since: datetime) -> list[ControlCommand]: ...

    def reply(self, command: ControlCommand, hostname: str, reply: str) -> None: ...


class ControlBroadcasts(Protocol):
    """What the sender of a broadcast needs (``store.control.ControlStore``)."""

    def broadcast(
        self,
        command: str,
        arguments: str,
        *,
        destination: str | None = None,
        pattern: str | None = None,
        matcher: str | None = None,
        ticket: str | None = None,
        ttl_seconds: float,
    ) -> None: ...

    def replies(self, ticket: str, after: int = 0) -> list[ControlReply]: ...

    def drop_replies(self, ticket: str) -> int: ...
