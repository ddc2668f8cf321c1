"""The job store in memory: the ports of ``store/ports.py`` without a database, for unit
tests of the runtime (see :mod:`celery_ratchet.store.memory.store`)."""

from __future__ import annotations

from celery_ratchet.store.memory.store import MemoryStore
from celery_ratchet.store.ports import (
    ControlBroadcasts,
    ControlCommands,
    DeadLetterStore,
    ScheduleStore,
    WorkerStore,
)

__all__ = ["MemoryStore"]


def _implements_the_ports(
    store: MemoryStore,
) -> tuple[WorkerStore, DeadLetterStore, ScheduleStore, ControlCommands, ControlBroadcasts]:
    """Never called: mypy checks here that a MemoryStore is every port of store/ports.py."""
    return store, store, store, store, store
