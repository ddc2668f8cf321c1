"""The queues an operator paused (``ratchet queues pause``), as a node last read them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from celery_ratchet.domain.queue_pause import PausedQueue, claimable
from celery_ratchet.errors import StoreBusy, StorePermissionDenied, StoreUnavailable
from celery_ratchet.runtime.clock import Clock

logger = logging.getLogger(__name__)

#: A reading that keeps failing for another reason than an outage is said this seldom.
SAY_EVERY_SECONDS = 60.0


class PauseStore(Protocol):
    def paused_queues(self) -> dict[str, PausedQueue]: ...


class PausedQueues:
    """Owned by the claim loop's thread, which calls :meth:`refresh` before each claim; other
    threads read :attr:`paused` (a frozenset, replaced whole) and :meth:`fresh`.

    Until a first reading succeeds, every queue counts as paused: a node that cannot read
    the pauses claims nothing rather than claim from a paused queue."""

    def __init__(self, store: PauseStore, clock: Clock, max_age: float) -> None:
        self._store = store
        self._clock = clock
        self._max_age = max_age
        self._read_at: float | None = None
        self._said_at: float | None = None
        #: The paused queues as last read: every queue's name, not only this node's.
        self.paused: frozenset[str] = frozenset()

    def refresh(self, own: Sequence[str]) -> None:
        """Read the paused queues again when the last reading is older than the bound; say
        which of ``own`` (this node's queues) stop or start being claimed. A store that
        cannot be read keeps the last reading: in an outage the claim that follows fails
        anyway; any other failure is said, once a minute."""
        now = self._clock.monotonic()
        if self.fresh():
            return
        try:
            found = frozenset(self._store.paused_queues())
        except StorePermissionDenied as exc:
            self._say(now, "ratchet: the paused queues were not read: %s", exc)
            return
        except (StoreUnavailable, StoreBusy):
            return
        except Exception as exc:
            self._say(now, "ratchet: the paused queues were not read: %s", exc, trace=True)
            return
        first = self._read_at is None
        self._read_at, self._said_at = now, None
        before, self.paused = self.paused, found
        stopped = [q for q in own if q in found and (first or q not in before)]
        started = [q for q in own if q in before and q not in found]
        if stopped:
            logger.info("ratchet: paused, not claiming from: %s", ", ".join(stopped))
        if started:
            logger.info("ratchet: resumed, claiming again from: %s", ", ".join(started))

    def fresh(self) -> bool:
        """Whether the last reading is younger than the bound (never: none yet)."""
        read_at = self._read_at
        return read_at is not None and self._clock.monotonic() - read_at < self._max_age

    def claimable(self, own: Sequence[str]) -> list[str]:
        """``own`` less the paused queues, in its order; none before a first reading."""
        if self._read_at is None:
            return []
        return claimable(own, self.paused) if self.paused else list(own)

    def holds_any_of(self, own: Sequence[str]) -> bool:
        """Whether some of ``own`` is paused, or may be (no reading yet)."""
        return self._read_at is None or any(q in self.paused for q in own)

    @property
    def max_age(self) -> float:
        return self._max_age

    def _say(self, now: float, message: str, exc: BaseException, *, trace: bool = False) -> None:
        if self._said_at is not None and now - self._said_at < SAY_EVERY_SECONDS:
            return
        self._said_at = now
        logger.warning(message, exc, exc_info=exc if trace else None)
