"""What the dashboard (``celery_ratchet.web``) asks of the job store, one Protocol per concern,
with the values they answer.

:class:`~celery_ratchet.store.jobstore.JobStore` implements :class:`DashboardStore` (mypy
checks it there): its operations, and the parts the dashboard reads through
(:class:`~celery_ratchet.store.inspection.Inspection`,
:class:`~celery_ratchet.store.metrics_reads.MetricsReads`, the batch rows and the remote
control rows). The dashboard depends on these, never on a class of the store, so that it is
given a store and never makes one. Like :mod:`celery_ratchet.store.ports`, they import no
SQLAlchemy (pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from celery_ratchet.domain.batch import BatchState, BatchSummary
from celery_ratchet.domain.job import JobStatus, JobSummary
from celery_ratchet.store.ports import ControlBroadcasts, DeadLetterStore, ScheduleStore


@dataclass(frozen=True)
class Durations:
    """How many durations were read, their sum, and how many were at most each bound."""

    count: int
    total: float
    at_most: tuple[int, ...]


@dataclass(frozen=True)
class NodeReading:
    node_id: str
    hostname: str
    concurrency: int
    heartbeat_age: float


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape's reading of the store, by the database clock (``read_at``)."""

    read_at: datetime
    #: (queue, status) → jobs, for PENDING, WAITING and RUNNING; schedules are not jobs.
    jobs: dict[tuple[str, str], int]
    #: queue → pending jobs due now.
    due: dict[str, int]
    #: queue → seconds the oldest due pending job has waited.
    oldest_due_age: dict[str, float]
    #: queue → FAILED jobs kept.
    dead_letters: dict[str, int]
    #: queue → seconds since it was paused (``ratchet queues pause``).
    paused: dict[str, float]
    nodes: list[NodeReading]
    #: node id → jobs RUNNING under it (a node gone from the table included).
    running_by_node: dict[str, int]
    #: resource → its capacity (None: no node declared it) and the permits held now.
    resources: dict[str, tuple[int | None, int]]
    #: ``active`` (waiting for their next fire time, or firing) and ``paused`` schedules.
    schedules: dict[str, int]
    #: Active schedules whose fire time has passed and that no worker has fired yet.
    schedules_late: int
    #: schedule (business key) → seconds since its fire time, for schedules due and not fired
    #: yet; the most late first, at most ``late_shown``.
    late_schedules: dict[str, float]
    #: status → jobs that ended within the window.
    finished: dict[str, int]
    #: task → wait (due → start) of jobs that ended within the window, from the newest.
    waits: dict[str, Durations]
    #: (task, status) → run time (start → end) of the same jobs.
    runs: dict[tuple[str, str], Durations]
    #: How many finished jobs the durations were read from (at most ``limit``).
    sampled: int


class MetricsReading(Protocol):
    """One Prometheus scrape's reading (``store.metrics_reads.MetricsReads``)."""

    def read(
        self,
        *,
        window_seconds: float,
        limit: int,
        bounds: Sequence[float],
        late_shown: int = 50,
    ) -> MetricsSnapshot: ...


class Inspecting(Protocol):
    """Read-only views the dashboard's pages show (``store.inspection.Inspection``)."""

    def database_now(self) -> datetime: ...

    def job_exists(self, job_id: str) -> bool: ...

    def finished_per_minute(self, minutes: int = 60) -> list[int]: ...

    def job_links(self, job_id: str) -> dict[str, Any] | None: ...

    def children_by_status(self, batch_id: str) -> dict[str, int]: ...

    def resources(self) -> list[dict[str, Any]]: ...

    def task_stats(self, window_seconds: float) -> list[dict[str, Any]]: ...

    def task_series(
        self, task_name: str | None, window_seconds: float, buckets: int
    ) -> dict[str, Any]: ...

    def scheduled_later(self) -> dict[str, int]: ...


class BatchSummaries(Protocol):
    """Batches as listed, with their progress (``store.batches.BatchStore``)."""

    def summaries(
        self, *, state: BatchState | None = None, limit: int = 50, batch_id: str | None = None
    ) -> list[BatchSummary]: ...


class DashboardStore(DeadLetterStore, ScheduleStore, Protocol):
    """Everything the dashboard's pages, actions, worker commands and ``/metrics`` use: the
    store's listings and operations (those of the CLI), and its read-side parts."""

    @property
    def inspection(self) -> Inspecting: ...

    @property
    def metrics_reads(self) -> MetricsReading: ...

    @property
    def batches(self) -> BatchSummaries: ...

    @property
    def control(self) -> ControlBroadcasts: ...

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
        task_contains: str | None = None,
        ticks: bool = True,
        created_since: datetime | None = None,
        created_until: datetime | None = None,
    ) -> list[JobSummary]: ...

    def list_nodes(self) -> list[dict[str, Any]]: ...

    def queue_stats(self) -> dict[str, Any]: ...

    def job_log(self, job_id: str, limit: int = 1000) -> list[tuple[datetime, str, str]]: ...

    def request_revoke(
        self,
        job_ids: Sequence[str],
        error: str,
        *,
        terminate_signal: str | None = None,
        batches: list[str] | None = None,
    ) -> tuple[int, int]: ...

    def purge_pending(self, queues: Sequence[str]) -> int: ...

    def pause_queue(self, queue: str, reason: str | None = None) -> bool: ...

    def resume_queue(self, queue: str) -> bool: ...
