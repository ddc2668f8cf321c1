"""The queues an operator paused (``ratchet queues pause``), as a node last read them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from celery_ratchet.domain.queue_pause import PausedQueue, claimable
from celery_ratchet.errors import StoreBusy, StoreUnavailable
from celery_ratchet.runtime.clock import Clock

logger = logging.getLogger(__name__)


class PauseStore(Protocol):
    def paused_queues(self) -> dict[str, PausedQueue]: ...


class PausedQueues:
    """Owned by the claim loop's thread, which calls :meth:`refresh` before each claim; other
    threads may read :attr:`paused` (a frozenset, replaced whole)."""

    def __init__(self, store: PauseStore, clock: Clock, max_age: float) -> None:
        self._store = store
        self._clock = clock
        self._max_age = max_age
        self._read_at: float | None = None
        #: The paused queues as last read: every queue's name, not only this node's.
        self.paused: frozenset[str] = frozenset()

    def refresh(self, own: Sequence[str]) -> None:
        """Read the paused queues again when the last reading is older than the bound; say
        which of ``own`` (this node's queues) stop or start being claimed. An unreachable
        store keeps the last reading: the claim that follows meets the outage anyway."""
        now = self._clock.monotonic()
        if self._read_at is not None and now - self._read_at < self._max_age:
            return
        try:
            found = frozenset(self._store.paused_queues())
        except (StoreUnavailable, StoreBusy):
            return
        except Exception:
            logger.exception("ratchet: the paused queues were not read; keeping the last reading")
            return
        self._read_at = now
        before, self.paused = self.paused, found
        stopped = [q for q in own if q in found and q not in before]
        started = [q for q in own if q in before and q not in found]
        if stopped:
            logger.info("ratchet: paused, not claiming from: %s", ", ".join(stopped))
        if started:
            logger.info("ratchet: resumed, claiming again from: %s", ", ".join(started))

    def claimable(self, own: Sequence[str]) -> list[str]:
        """``own`` less the paused queues, in its order."""
        return claimable(own, self.paused) if self.paused else list(own)

    def holds_any_of(self, own: Sequence[str]) -> bool:
        return any(q in self.paused for q in own)

    @property
    def max_age(self) -> float:
        return self._max_age
