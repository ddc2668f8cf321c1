"""An execution's end, handed to the worker's runtime: settled, released, or only counted.

Every claimed execution ends here once, in the worker's main process, through its
:class:`~celery_ratchet.celery.execution.job_message.JobMessage`: reported by the
:class:`~celery_ratchet.celery.execution.request.RatchetRequest` hooks for what Celery decided,
or by the :class:`~celery_ratchet.celery.execution.dispatch.Dispatcher` for a job Celery never
took. What to write is the runtime's :class:`~celery_ratchet.runtime.outcomes.Settler`'s.
"""

from __future__ import annotations

from celery_ratchet.domain.job import ClaimedJob, JobStatus, Settlement
from celery_ratchet.runtime.worker import WorkerRuntime


def report_end(
    runtime: WorkerRuntime,
    job: ClaimedJob,
    status: JobStatus | None,
    error: str | None,
    traceback: str | None,
    failed: bool | None = None,
) -> None:
    """``status`` written to the job's row by the settler; ``None`` when the row moved on
    already (a retry rescheduled it, the result backend wrote it, the claim is another
    node's): only the slot is freed. ``failed`` (when known) counts in the task's circuit
    breaker."""
    if failed is not None:
        runtime.record_outcome(job.job_id, job.token, failed)
    if status is None:
        # A success whose result the backend stored (failed False) finished its row.
        runtime.release(job.job_id, job.token, due_again=failed is not False)
    else:
        runtime.settle(Settlement(job.job_id, job.token, status, error, traceback))
