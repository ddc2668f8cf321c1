"""Managing recurring masters in the store: register, pause, resume, cancel, list.
Knows nothing of Celery; the message a master fires is built by the caller."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_ratchet.domain.job import SCHEDULES_QUEUE, JobStatus, JobType, Message, NewJob
from celery_ratchet.domain.schedule import MASTER_PREFIX, MasterSpec
from celery_ratchet.store.ports import ScheduleStore

logger = logging.getLogger(__name__)

#: Longest business key whose occurrence ids ("recurring:<key>@<UTC ISO time>") fit a job id.
MAX_KEY_LENGTH = 255 - len(MASTER_PREFIX) - len("@2026-01-01T00:00:00+00:00")


#: Fire times a schedule listing shows ahead.
UPCOMING_SHOWN = 5


def master_id(business_key: str) -> str:
    """The job id of the master of ``business_key``: the unique index on job ids is what
    makes a business key register one master, however many nodes register it."""
    return f"{MASTER_PREFIX}{business_key}"


def occurrence_id(master_job_id: str, fire: datetime) -> str:
    """Unique per (master, fire time): a tick fires once, however many nodes see it."""
    return f"{master_job_id}@{fire.astimezone(timezone.utc).isoformat()}"


class UnknownSchedule(LookupError):
    def __init__(self, business_key: str) -> None:
        super().__init__(f"no recurring job {business_key!r} (see `ratchet schedules`)")


def register(
    store: ScheduleStore,
    business_key: str,
    spec: MasterSpec,
    *,
    task_name: str,
    priority: int,
    message: Message,
    now: datetime | None = None,
) -> str:
    """Create or update the master of ``business_key``; returns 'created', 'updated' or
    'revived'. ``message`` is the task message every occurrence is made from."""
    master = master_job(
        business_key, spec, task_name=task_name, priority=priority, message=message, now=now
    )
    return store.upsert_master(master)


def master_job(
    business_key: str,
    spec: MasterSpec,
    *,
    task_name: str,
    priority: int,
    message: Message,
    now: datetime | None = None,
) -> NewJob:
    """The master row :func:`register` writes, checked (its key's length, a first fire time
    after ``now``) and written nowhere: a dry run makes it to check as a registration does."""
    if not business_key or len(business_key) > MAX_KEY_LENGTH:
        raise ValueError(
            f"business key of a recurring job must be 1-{MAX_KEY_LENGTH} "
            f"characters, got {len(business_key)}: {business_key[:40]!r}..."
        )
    now = now or datetime.now(timezone.utc)
    first = spec.timetable.next_after(now)
    if first is None:
        raise ValueError(
            f"recurring job {business_key!r}: {spec.schedule} has no fire time "
            f"after {now.isoformat()}"
        )
    return NewJob(
        job_id=master_id(business_key),
        task_name=task_name,
        queue=SCHEDULES_QUEUE,
        priority=priority,
        message=message,
        due=first,
        job_type=JobType.RECURRING,
        business_key=business_key,
        schedule_spec=spec.to_json(),
    )


def pause(store: ScheduleStore, business_key: str) -> None:
    if not store.set_master_status(master_id(business_key), JobStatus.PAUSED):
        _explain(store, business_key, "pause", "PENDING")


def resume(store: ScheduleStore, business_key: str, now: datetime | None = None) -> None:
    """Resume at the next fire time from now: what was missed while paused is not a misfire."""
    master = _get(store, business_key)
    spec = MasterSpec.from_json(master["schedule_spec"])
    due = spec.timetable.next_after(now or datetime.now(timezone.utc))
    if due is None:
        raise ValueError(
            f"cannot resume recurring job {business_key!r}: {spec.schedule} has "
            "no fire time left; remove it"
        )
    if not store.set_master_status(master["job_id"], JobStatus.PENDING, due=due):
        _explain(store, business_key, "resume", "PAUSED")


def run_now(store: ScheduleStore, business_key: str) -> None:
    """Fire the schedule now, once, besides its fire times: its master becomes due now, so
    the next node to look fires it through the usual path (one occurrence, whose id is its
    fire time), and its next due time is the fire time it had."""
    if not store.run_master_now(master_id(business_key)):
        _explain(store, business_key, "run", "PENDING with a fire time ahead")


def cancel(store: ScheduleStore, business_key: str) -> None:
    if not store.set_master_status(master_id(business_key), JobStatus.REVOKED):
        _explain(store, business_key, "remove", "active")


def keys_by_origin(store: ScheduleStore) -> dict[str | None, list[str]]:
    """The business keys of the active masters, by what registered them (the spec's
    ``origin``; None for the API). A spec this version cannot read is left out: it cannot
    be told whose it is, so nothing is done to it."""
    found: dict[str | None, list[str]] = {}
    for master in store.list_masters():
        try:
            origin = MasterSpec.from_json(master["schedule_spec"]).origin
        except (ValueError, KeyError, TypeError):
            continue
        found.setdefault(origin, []).append(master["business_key"])
    return found


def remove_gone(store: ScheduleStore, origin: str, kept: Iterable[str]) -> list[str]:
    """Cancel the active masters registered by ``origin`` whose key is not in ``kept``
    (entries gone from the configuration that owns them); returns their keys. Masters of
    another origin, those of the API included, are never touched."""
    keep = set(kept)
    gone = [key for key in keys_by_origin(store).get(origin, []) if key not in keep]
    removed = []
    for key in gone:
        # Cancelled meanwhile by another node starting with the same configuration: done.
        if store.set_master_status(master_id(key), JobStatus.REVOKED):
            removed.append(key)
    return removed


def describe(store: ScheduleStore, *, with_last_fire: bool = False) -> list[dict[str, Any]]:
    """Every active master with its schedule, zone, misfire policy and next fire times;
    ``with_last_fire``: also the last fire time whose occurrence the store holds."""
    rows = []
    for master in store.list_masters():
        try:
            row = _described(store, master, with_last_fire=with_last_fire)
        except (ValueError, KeyError, TypeError) as exc:
            # One stored spec this version cannot read (written by hand, by another tool or
            # a newer version) is shown as unreadable, not a failed listing; not its text.
            logger.warning(
                "schedule %r: its stored spec is unreadable (%s)",
                master["business_key"], type(exc).__name__,
            )  # fmt: skip
            row = _unreadable(master, with_last_fire=with_last_fire)
        rows.append(row)
    return rows


def _described(
    store: ScheduleStore, master: dict[str, Any], *, with_last_fire: bool
) -> dict[str, Any]:
    spec = MasterSpec.from_json(master["schedule_spec"])
    extra: dict[str, Any] = {}
    if with_last_fire:
        extra["last_fire"] = last_fire(store, master["job_id"], spec, master["scheduled_time"])
    return {
        **extra,
        "business_key": master["business_key"],
        "name": spec.name,
        "task": master["task_name"],
        "schedule": spec.schedule.partition(":")[2]
        if spec.schedule.startswith("cron:")
        else f"every {spec.schedule.partition(':')[2]} s",
        "zone": spec.zone,
        "misfire": spec.misfire,
        "status": master["status"],
        "next_fire": master["scheduled_time"],
        "upcoming": upcoming(spec, master["scheduled_time"]),
        "queue": spec.queue,
        "tags": ",".join(spec.tags),
    }


def _unreadable(master: dict[str, Any], *, with_last_fire: bool) -> dict[str, Any]:
    unreadable = "unreadable"
    return {
        **({"last_fire": None} if with_last_fire else {}),
        "business_key": master["business_key"],
        "name": None,
        "task": master["task_name"],
        "schedule": unreadable,
        "zone": unreadable,
        "misfire": unreadable,
        "status": master["status"],
        "next_fire": master["scheduled_time"],
        "upcoming": [],
        "queue": unreadable,
        "tags": "",
    }


def upcoming(spec: MasterSpec, next_fire: datetime, count: int = UPCOMING_SHOWN) -> list[datetime]:
    """The next ``count`` fire times from ``next_fire`` (the master's due time) on."""
    times = [next_fire]
    while len(times) < count:
        following = spec.timetable.next_after(times[-1])
        if following is None:
            break
        times.append(following)
    return times


#: Scheduled fire times before the next one that :func:`last_fire` looks up.
_LAST_FIRES_LOOKED_UP = 3


def last_fire(
    store: ScheduleStore, master_job_id: str, spec: MasterSpec, next_fire: datetime
) -> tuple[datetime, JobStatus | str] | None:
    """The latest fire time before ``next_fire`` whose occurrence is in the store, with the
    occurrence's status: its id follows from the fire time, so a few indexed lookups find
    it. None when none of the last few scheduled fire times fired (paused, skipped as a
    misfire, archived)."""
    ahead = upcoming(spec, next_fire, 2)
    period = ahead[1] - ahead[0] if len(ahead) == 2 else timedelta(days=1)
    earlier: list[datetime] = []
    moment = next_fire - period * (_LAST_FIRES_LOOKED_UP + 1)
    while len(earlier) < 1000:
        fire = spec.timetable.next_after(moment)
        if fire is None or fire >= next_fire:
            break
        earlier.append(fire)
        moment = fire
    for fire in reversed(earlier[-_LAST_FIRES_LOOKED_UP:]):
        record = store.result(occurrence_id(master_job_id, fire))
        if record is not None:
            return fire, record.status
    return None


def _get(store: ScheduleStore, business_key: str) -> dict[str, Any]:
    for master in store.list_masters(include_cancelled=True):
        if master["job_id"] == master_id(business_key):
            return master
    raise UnknownSchedule(business_key)


def _explain(store: ScheduleStore, business_key: str, action: str, needed: str) -> None:
    master = _get(store, business_key)
    raise ValueError(
        f"cannot {action} recurring job {business_key!r}: it is {master['status']}, not {needed}"
    )
