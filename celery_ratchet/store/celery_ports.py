"""What the Celery layer (``celery_ratchet.celery``) asks of the job store, one Protocol per
concern, and :class:`CeleryStore`, all of them at once.

Its rooms reach the store through ``ratchet_state(app).store`` and ``.batches``, typed by
these; only the assembly (``celery/state.py``, ``celery/app/``) names
:class:`~celery_ratchet.store.jobstore.JobStore`, and mypy checks there that a JobStore is a
:class:`CeleryStore`. Unlike :mod:`celery_ratchet.store.ports`, these name the store's unit of
work (:class:`~celery_ratchet.store.units.Unit`, which the layers above hand back and never
open) and the batch row as read (:class:`~celery_ratchet.store.batch_rows.BatchRecord`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from celery_ratchet.domain.batch import BatchPart, BatchState, NewBatch
from celery_ratchet.domain.job import ClaimedJob, JobStatus, NewJob, ResultRecord
from celery_ratchet.domain.workflow import Branch
from celery_ratchet.store.batch_progress import MakeReports, ProgressWrites, ReportId
from celery_ratchet.store.batch_rows import BatchRecord, Progress
from celery_ratchet.store.ports import Announcing, WorkerStore
from celery_ratchet.store.read_ports import BatchSummaries, DashboardStore
from celery_ratchet.store.units import Unit

__all__ = [
    "BatchRecord",
    "BatchStreams",
    "Batches",
    "BrokerImportStore",
    "CeleryStore",
    "CeleryWorkerStore",
    "HousekeepingStore",
    "Progress",
    "ProgressReporting",
    "ResultStore",
    "SendStore",
    "WorkflowConditions",
]


class BatchStreams(Protocol):
    """Streamed batches: chunks written under a lease (``store/batch_streams.py``)."""

    def write_chunk(
        self,
        batch_id: str,
        jobs: Sequence[NewJob],
        waiting: Sequence[NewJob],
        written: int,
        lease_seconds: float,
    ) -> None: ...

    def renew_lease(self, batch_id: str, lease_seconds: float) -> None: ...

    def end_stream(self, batch_id: str, total: int) -> BatchRecord: ...

    def abandoned_streams(self, limit: int = 100) -> list[str]: ...


class WorkflowConditions(Protocol):
    """A workflow's branches, decided when their parent ends
    (``store/workflow_conditions.py``)."""

    def add_conditions(
        self, parent_id: str, rows: Sequence[dict[str, Any]], unit: Unit | None = None
    ) -> None: ...

    def conditions(self, parent_id: str) -> list[Branch]: ...

    def deciding(self, parent_id: str) -> AbstractContextManager[Unit | None]: ...

    def decide(self, unit: Unit, parent_id: str, states: Mapping[int, str]) -> set[int]: ...


class ProgressReporting(Protocol):
    """A batch's progress reports (``store/batch_progress.py``)."""

    def write_progress(
        self, batch_id: str, make: MakeReports, report_id: ReportId
    ) -> ProgressWrites: ...

    def progress_ended(self, batch_id: str, percent: int, report_id: ReportId) -> list[str]: ...

    def progress_behind(self, limit: int = 100) -> list[str]: ...


class Batches(BatchStreams, WorkflowConditions, ProgressReporting, BatchSummaries, Protocol):
    """Batches, chords and chain steps completed by the database (``store/batches.py``)."""

    def open(
        self,
        new: NewBatch,
        *,
        restart: bool = False,
        unit: Unit | None = None,
        lease_seconds: float | None = None,
    ) -> None: ...

    def open_groups(self, group_ids: Sequence[str], unit: Unit | None = None) -> None: ...

    def set_total(self, batch_id: str, total: int, unit: Unit | None = None) -> None: ...

    def add_children(self, batch_id: str, count: int = 1, unit: Unit | None = None) -> None: ...

    def failed_children(self, batch_id: str, limit: int) -> list[str]: ...

    def record_part(self, part: BatchPart) -> BatchRecord | None: ...

    def get(self, batch_id: str, unit: Unit | None = None) -> BatchRecord | None: ...

    def parts(self, batch_id: str) -> list[BatchPart]: ...

    def finishing(
        self, batch_id: str, state: BatchState, *, abandoned: bool = False
    ) -> AbstractContextManager[Unit | None]: ...

    def unfinished_complete(self, older_than_seconds: float, limit: int = 100) -> list[str]: ...

    def prune(self, older_than_days: float) -> int: ...


class SendStore(Protocol):
    """The send path: jobs written, alone, in the caller's unit of work, or in place of one."""

    def enqueue_many(
        self,
        jobs: Sequence[NewJob],
        waiting: Sequence[NewJob] = (),
        *,
        maybe_committed: bool = False,
    ) -> dict[str, str]: ...

    def enqueue_within(
        self, unit: Unit, jobs: Sequence[NewJob], waiting: Sequence[NewJob] = ()
    ) -> dict[str, str]: ...

    def wait_in_place(self, job_id: str, token: str, unit: Unit | None = None) -> bool: ...

    def replace_running(self, token: str, new: NewJob) -> bool: ...

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
    ) -> None: ...


class BrokerImportStore(Protocol):
    """Moving a broker's messages into the store (``celery ratchet import-broker``)."""

    def stored_contents(self, ids: Sequence[str]) -> dict[str, tuple[str, bytes | None]]: ...

    def import_jobs(self, moved: Sequence[tuple[NewJob, Sequence[NewJob]]]) -> set[str]: ...


class ResultStore(SendStore, Announcing, Protocol):
    """The result backend on the job rows."""

    #: The store's URL, password included (``as_uri(include_password=True)``).
    url: str

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
    ) -> bool: ...

    def result(self, job_id: str) -> ResultRecord | None: ...

    def note_retry(self, job_id: str, error: str | None, traceback: str | None) -> bool: ...

    def store_progress(
        self, job_id: str, token: str, meta: str | None, *, started: bool
    ) -> None: ...

    def forget(self, job_id: str) -> None: ...

    def expire_results(self, older_than_seconds: float) -> int: ...

    def save_group(self, group_id: str, result: str) -> None: ...

    def load_group(self, group_id: str) -> str | None: ...

    def delete_group(self, group_id: str) -> None: ...


class CeleryWorkerStore(WorkerStore, Protocol):
    """What Celery's worker side asks beside the runtime's own: claims checked before a task
    runs, the queues of the live nodes, the jobs due later (``inspect scheduled``)."""

    def holds(self, job_id: str, token: str) -> bool: ...

    def live_node_queues(self, grace_seconds: float) -> dict[str, list[str]]: ...

    def nodes_knowing(
        self, task_name: str, queue: str, grace_seconds: float, *, excluding: str | None = None
    ) -> list[str]: ...

    def scheduled_jobs(self, queues: Sequence[str], limit: int) -> list[ClaimedJob]: ...

    def purge_pending(self, queues: Sequence[str]) -> int: ...


class HousekeepingStore(Protocol):
    """Finished jobs archived, logs purged, and the log lines of a job."""

    def archive_finished(
        self,
        older_than_days: float,
        batch_size: int = 1000,
        progress: Callable[[int], None] | None = None,
    ) -> int: ...

    def purge_logs(self, older_than_days: float) -> int: ...

    def add_log(self, job_id: str, level: str, message: str) -> None: ...


class CeleryStore(
    ResultStore,
    BrokerImportStore,
    CeleryWorkerStore,
    HousekeepingStore,
    DashboardStore,
    Protocol,
):
    """Everything the Celery layer's rooms ask of the store (``ratchet_state(app).store``):
    with the dashboard's (its remote control rows among them), since the control room
    serves the dashboard and Flower."""

    @property
    def batches(self) -> Batches: ...
