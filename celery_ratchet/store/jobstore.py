"""The job store: every read and write of job rows, as named operations.

Every completion is a compare-and-swap on (job id, claim token, status RUNNING): a worker whose
claim was taken away (orphan recovery, a retry that rescheduled the row) can never overwrite it.
"""

from __future__ import annotations

from celery_ratchet.store.admin import AdminOps
from celery_ratchet.store.enqueue import EnqueueOps
from celery_ratchet.store.nodes import NodeOps
from celery_ratchet.store.ports import DeadLetterStore, ScheduleStore, WorkerStore
from celery_ratchet.store.recurring import MasterOps
from celery_ratchet.store.results import ResultOps
from celery_ratchet.store.revocation import RevocationOps
from celery_ratchet.store.settle import ClaimOps
from celery_ratchet.store.step_handoff import StepHandoffOps


class JobStore(
    MasterOps,
    EnqueueOps,
    NodeOps,
    StepHandoffOps,
    ClaimOps,
    ResultOps,
    RevocationOps,
    AdminOps,
):
    """Job rows in one database. Thread-safe; one instance per URL per process is enough.
    Each concern's operations live in their own module; this class puts them together."""


def _implements_the_ports(store: JobStore) -> tuple[WorkerStore, DeadLetterStore, ScheduleStore]:
    """Never called: mypy checks here that a JobStore is every port the runtime asks for."""
    return store, store, store
