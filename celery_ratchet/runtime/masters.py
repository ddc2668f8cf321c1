"""Firing the recurring masters that are due: claimed in batches, their occurrences written."""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from datetime import datetime, timedelta

from celery_ratchet.domain.job import (
    SCHEDULES_QUEUE,
    ClaimedJob,
    NewJob,
)
from celery_ratchet.domain.schedule import MasterSpec, Plan, plan
from celery_ratchet.errors import StoreBusy, StoreUnavailable
from celery_ratchet.runtime.base import (
    _DUE_MARGIN_SECONDS,
    _MASTER_BATCH,
    _MASTER_CHECK_SECONDS,
    _MASTER_RETRY_SECONDS,
    NodeEvents,
    OccurrenceFactory,
    Throttle,
)
from celery_ratchet.runtime.channel import Channel
from celery_ratchet.runtime.clock import Clock
from celery_ratchet.runtime.standing import Standing
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.ports import ScheduleStore

logger = logging.getLogger(__name__)


class Masters:
    """Run by the claim loop's thread, which owns the due times; :meth:`changed` is
    thread-safe."""

    def __init__(
        self,
        store: ScheduleStore,
        settings: RatchetSettings,
        *,
        node_id: str,
        occurrence: OccurrenceFactory,
        standing: Standing,
        channel: Channel,
        events: NodeEvents,
        clock: Clock,
        throttle: Throttle,
    ) -> None:
        self.store = store
        self.settings = settings
        self.node_id = node_id
        self.occurrence = occurrence
        self._standing = standing
        self._channel = channel
        self._events = events
        self._clock = clock
        self._throttle = throttle
        #: Monotonic times: claim when the earliest master is due; read when that is again
        #: (a master created or changed elsewhere, without a wake-up).
        self._master_due = 0.0
        self._master_look = 0.0
        self._changed = threading.Event()  # told: read their due time again

    def changed(self) -> None:
        """A master was created or changed: read their due time again."""
        self._changed.set()

    def next_look_in(self) -> float:
        """Seconds until the claim loop should call :meth:`fire_due` again."""
        if self._changed.is_set():
            return 0.0
        at = min(self._master_due, self._master_look)
        return max(0.0, at - self._clock.monotonic())

    def fire_due(self) -> None:
        """Recurring masters take no slot: they are claimed on their own, whatever the load,
        so a busy node never makes a tick late (and a late tick a misfire). Their next due
        time is known in advance: the node claims when the earliest one is due, and reads
        that time again after each claim, when told a master changed, and otherwise every
        poll interval (with a wake-up channel: every ``wakeup_poll_interval``)."""
        now = self._clock.monotonic()
        due = now >= self._master_due
        look = now >= self._master_look or self._changed.is_set()
        if not (due or look):
            return
        if self._standing.stale():  # claim and read again shortly, without a spin meanwhile
            self._changed.clear()
            self._master_due = self._master_look = now + _MASTER_CHECK_SECONDS
            return
        fired = False
        if due:
            try:
                masters = self.store.claim(self.node_id, [SCHEDULES_QUEUE], _MASTER_BATCH)
            except Exception as exc:
                self._throttle.warn("masters", "ratchet: recurring jobs not checked: %s", exc)
                self._master_due = now + self.settings.poll_interval
                return
            self._fire(masters)
            if len(masters) == _MASTER_BATCH:  # there may be more due: claim again at once
                self._master_due = 0.0
                return
            fired = bool(masters)
        self._read_master_due(claimed_none=due and not fired)

    def _read_master_due(self, *, claimed_none: bool) -> None:
        # Cleared before reading: a change announced meanwhile is read again next round.
        self._changed.clear()
        try:
            due_in = self.store.next_due_in([SCHEDULES_QUEUE])
        except Exception as exc:
            self._throttle.warn("masters", "ratchet: recurring jobs not checked: %s", exc)
            due_in = self.settings.poll_interval
        now = self._clock.monotonic()
        self._master_look = now + self._channel.idle_look()
        if due_in is None:
            self._master_due = float("inf")
        elif due_in > 0:
            self._master_due = now + due_in + _DUE_MARGIN_SECONDS
        else:
            # Due already: claim it now; if a claim just found nothing (another node holds
            # it, or it is not claimable yet), look again a little later, not in a spin.
            self._master_due = now + (_MASTER_CHECK_SECONDS if claimed_none else 0.0)

    def _fire(self, masters: Sequence[ClaimedJob]) -> None:
        """Recurring masters came due: create their occurrences, per each one's misfire
        policy, and set their next due times, all in one transaction."""
        firings: list[tuple[ClaimedJob, list[NewJob], datetime | None]] = []
        plans: list[tuple[MasterSpec, Plan] | None] = []
        for master in masters:
            # The database clock decides what is overdue, as it decided what was due.
            now = max(master.claimed_now or self._clock.now(), master.scheduled_time)
            try:
                spec = MasterSpec.from_json(master.schedule_spec or "")
                decided = plan(spec.timetable, master.scheduled_time, now, spec.policy)
                occurrences = [self.occurrence(master, spec, fire) for fire in decided.fire]
            except Exception:
                # Perhaps only this node cannot (a missing time zone, an older version): try
                # again later, on whichever node claims it, rather than abandon the schedule.
                logger.exception(
                    "ratchet: recurring job %s cannot fire; retrying in %ss",
                    master.job_id,
                    _MASTER_RETRY_SECONDS,
                )
                retry_at = now + timedelta(seconds=_MASTER_RETRY_SECONDS)
                firings.append((master, [], retry_at))
                plans.append(None)
                continue
            firings.append((master, occurrences, decided.next_due))
            plans.append((spec, decided))
        if not firings:
            return
        fired: list[bool | None]
        try:
            fired = list(self.store.fire_masters(firings))
        except (StoreUnavailable, StoreBusy) as exc:  # left RUNNING: reconciliation returns them
            self._throttle.warn(
                "fire", "ratchet: %d recurring jobs did not fire: %s", len(firings), exc
            )
            return
        except Exception:
            # One master's occurrences refused (say, a field too long) must not hold the
            # others back: each on its own, and only that one stays unfired.
            fired = [self._fire_alone(*firing) for firing in firings]
        created = False
        for (master, occurrences, _), planned, ok in zip(firings, plans, fired, strict=True):
            if ok is None:  # said already
                continue
            if not ok:
                logger.warning(
                    "ratchet: recurring job %s lost its claim while firing", master.job_id
                )
                continue
            created = created or bool(occurrences)
            if planned is None:
                continue
            spec, decided = planned
            if decided.skipped:
                logger.warning(
                    "ratchet: recurring job %s missed %d fire times; policy %s created %d",
                    master.job_id,
                    decided.skipped + len(decided.fire),
                    spec.misfire,
                    len(decided.fire),
                )
        if created:
            self._events.hint.set()

    def _fire_alone(
        self, master: ClaimedJob, occurrences: Sequence[NewJob], next_due: datetime | None
    ) -> bool | None:
        """Fire one master; None when it failed (and that was logged)."""
        try:
            return self.store.fire_master(master, occurrences, next_due)
        except Exception as exc:  # left RUNNING: the next reconciliation hands it back
            self._throttle.warn(
                "fire", "ratchet: recurring job %s did not fire: %s", master.job_id, exc
            )
            return None
