"""What orphan recovery takes back from dead nodes, and the error of a job it gives up on."""

from __future__ import annotations

from dataclasses import dataclass, field

from celery_ratchet.domain.job import error_record


@dataclass(frozen=True)
class OrphanRecovery:
    """What one orphan scan took back from dead nodes."""

    #: Jobs due again (PENDING).
    requeued: list[str]
    #: Jobs past ``ratchet_max_recoveries``: FAILED, in the dead-letter queue.
    dead_lettered: list[str]
    #: The nodes declared dead (their rows deleted).
    dead_nodes: list[str]
    #: The queues of the requeued jobs.
    queues: list[str] = field(default_factory=list)

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
