"""Recurring jobs for Celery tasks: ``@recurring``, ``schedule_recurring`` and
``beat_schedule``, registered as masters in the store when a worker starts; no beat."""

from __future__ import annotations

import contextlib
import inspect
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery import Celery, signals
from celery.canvas import Signature
from celery.schedules import crontab
from celery.schedules import schedule as interval_schedule
from kombu.exceptions import EncodeError
from kombu.message import Message as KombuMessage
from kombu.utils import json as kjson

from celery_ratchet.celery.compat import unproxied
from celery_ratchet.celery.send.options import HEADER
from celery_ratchet.celery.send.sender import JobBatch
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.cron import CronExpression
from celery_ratchet.domain.job import SCHEDULES_QUEUE, ClaimedJob, Message, NewJob
from celery_ratchet.domain.retry import Backoff
from celery_ratchet.domain.schedule import DEFAULT_CATCH_UP, MasterSpec, MisfirePolicy
from celery_ratchet.errors import ConfigurationError, RatchetError, StoreBusy, StoreUnavailable
from celery_ratchet.runtime import recurring as masters

logger = logging.getLogger(__name__)

_ATTR = "ratchet_recurring"


@dataclass(frozen=True)
class RecurringOptions:
    cron: str
    zone: str = "UTC"
    name: str | None = None
    id: str | None = None
    priority: int | None = None
    max_retries: int = 3
    backoff_policy: str = "exponential"
    backoff_delay_ms: int = 1000
    timeout_seconds: int | None = 3600
    enabled: bool = True
    tags: tuple[str, ...] = ()
    misfire_policy: str = "catch_up"
    max_catch_up_executions: int = DEFAULT_CATCH_UP


def recurring(
    cron: str,
    zone: str = "UTC",
    name: str | None = None,
    id: str | None = None,
    priority: int | None = None,
    max_retries: int = 3,
    backoff_policy: str = "exponential",
    backoff_delay_ms: int = 1000,
    timeout_seconds: int | None = 3600,
    enabled: bool = True,
    tags: tuple[str, ...] | list[str] = (),
    misfire_policy: str = "catch_up",
    max_catch_up_executions: int = DEFAULT_CATCH_UP,
) -> Any:
    """Run the decorated task on a Quartz cron schedule, registered when a worker starts::

        @celery_ratchet.recurring(cron="0 0 2 * * ?", zone="Europe/London")
        @app.task
        def purge_sessions(): ...

    ``id`` (default: the task's name) is the business key: one master per key, however many
    nodes start. ``name`` (default: the function's name) is how listings show it. The task
    takes no arguments (or only ``self`` when bound).
    """
    CronExpression(cron, zone)  # a bad expression fails at import, naming the field
    MisfirePolicy.named(misfire_policy, max_catch_up_executions)
    options = RecurringOptions(
        cron,
        zone,
        name,
        id,
        priority,
        max_retries,
        backoff_policy,
        backoff_delay_ms,
        timeout_seconds,
        enabled,
        tuple(tags),
        misfire_policy,
        max_catch_up_executions,
    )

    def decorate(task: Any) -> Any:
        target = unproxied(task)
        _check_takes_no_arguments(target)
        _retry_on_failure(target, options)
        setattr(target, _ATTR, options)
        return task

    return decorate


def _retry_on_failure(task: Any, options: RecurringOptions) -> None:
    """The seeds' retries for a recurring task: up to ``max_retries``, waiting ``none`` (0),
    ``fixed`` (the delay) or ``exponential`` (delay * 2^(attempt-1), at most 24 h), to the
    millisecond. They are the task's ratchet options (``backoff``, ``backoff_param``), so its
    failures go through ratchet's retry decision as any task's do; Celery's autoretry would
    count the delay in whole seconds (500 ms became 1, 2, 4 s). A task that declares its own
    autoretry_for keeps it."""
    if options.max_retries <= 0 or getattr(task, "autoretry_for", None):
        return
    try:
        backoff = Backoff.parse(options.backoff_policy)
    except ValueError:
        raise ValueError(
            f"unknown backoff_policy {options.backoff_policy!r}: use none, fixed or exponential"
        ) from None
    task.max_retries = options.max_retries
    task.backoff = backoff.value
    task.backoff_param = options.backoff_delay_ms / 1000


def _check_takes_no_arguments(task: Any) -> None:
    try:
        parameters = inspect.signature(task.run).parameters.values()
    except (TypeError, ValueError):
        return
    required = [
        p.name
        for p in parameters
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        raise TypeError(
            f"@recurring task {task.name!r} must take no arguments (it is called "
            f"with none), but needs {', '.join(required)}"
        )


def schedule_recurring(
    app: Celery,
    cron: str | None,
    zone: str,
    signature: Signature,
    *,
    business_key: str,
    misfire: MisfirePolicy | None = None,
    tags: tuple[str, ...] | list[str] = (),
    options: dict[str, Any] | None = None,
    name: str | None = None,
    every: float | timedelta | None = None,
) -> str:
    """Register (or update in place) a recurring job known only at runtime::

        schedule_recurring(app, "0 0 * * * ?", "UTC", report.si(tenant_id),
                           business_key=f"hourly-report-{tenant_id}",
                           misfire=MisfirePolicy.catch_up(3))

    Calling it again with the same business key updates that schedule, never stacks a
    second one. ``every=`` (seconds or a timedelta) instead of ``cron`` fires at a fixed
    interval. Returns the business key. Nothing but a call removes it: a worker start
    removes only the ``beat_schedule`` entries gone from the configuration.
    """
    registration = _prepare(
        app, cron, zone, signature, business_key=business_key, misfire=misfire, tags=tags,
        options=options, name=name, every=every, origin=None,
    )  # fmt: skip
    return _write(app, registration)


@dataclass(frozen=True)
class _Registration:
    """A recurring job checked and made, not yet written: its master row and its spec."""

    business_key: str
    master: NewJob
    spec: MasterSpec
    zone: str


def _prepare(
    app: Celery,
    cron: str | None,
    zone: str,
    signature: Signature,
    *,
    business_key: str,
    misfire: MisfirePolicy | None,
    tags: tuple[str, ...] | list[str],
    options: dict[str, Any] | None,
    name: str | None,
    every: float | timedelta | None,
    origin: str | None,
) -> _Registration:
    """Everything a registration checks and makes, with nothing written: a dry run is this
    alone, a registration this and :func:`_write`."""
    if (cron is None) == (every is None):
        raise ValueError("give exactly one of cron and every")
    if every is not None:
        seconds = every.total_seconds() if isinstance(every, timedelta) else float(every)
        schedule_text = f"every:{seconds!r}"
    else:
        schedule_text = f"cron:{cron}"
    options = dict(options or {})
    expires = options.pop("expires", None)
    if isinstance(expires, timedelta):
        expires = expires.total_seconds()
    if expires is not None and not isinstance(expires, (int, float)):
        raise ValueError(
            f"recurring job {business_key!r}: give expires in seconds (each "
            f"occurrence expires that long after its fire time), not {expires!r}"
        )
    template = _template_job(app, signature, business_key, options)
    spec = MasterSpec(
        schedule=schedule_text,
        zone=zone,
        misfire=(misfire or MisfirePolicy()).to_text(),
        queue=template.queue,
        name=name,
        tags=tuple(tags),
        expires_seconds=float(expires) if expires is not None else None,
        origin=origin,
    )
    master = masters.master_job(
        business_key,
        spec,
        task_name=template.task_name,
        priority=template.priority,
        message=template.message,
        # The first fire time after the database's time: a node whose clock is ahead would
        # put it off, one behind would make fire times already past due at once.
        now=ratchet_state(app).clock.now(),
    )
    return _Registration(business_key, master, spec, zone)


def _write(app: Celery, registration: _Registration) -> str:
    state = ratchet_state(app)
    outcome = state.store.upsert_master(registration.master)
    # Workers sleep until the next due time they know of: tell them (PostgreSQL: the store
    # notified already).
    state.published([SCHEDULES_QUEUE])
    key, spec = registration.business_key, registration.spec
    logger.info(
        "ratchet: recurring job %s %s (%s, %s)", key, outcome, spec.schedule, registration.zone
    )
    return key


def cancel_recurring(app: Celery, business_key: str) -> None:
    masters.cancel(ratchet_state(app).store, business_key)


def pause_recurring(app: Celery, business_key: str) -> None:
    masters.pause(ratchet_state(app).store, business_key)


def resume_recurring(app: Celery, business_key: str) -> None:
    state = ratchet_state(app)
    masters.resume(state.store, business_key, now=state.clock.now())
    ratchet_state(app).published([SCHEDULES_QUEUE])


def _template_job(
    app: Celery, signature: Signature, business_key: str, options: dict[str, Any]
) -> NewJob:
    """The task message occurrences are made from, built by Celery's own send path (routing,
    serializer, time limits) into a batch that is never written. Not a send: no publish
    signal fires (each occurrence's does), so nothing of this moment's (a trace context
    that a receiver writes into the headers) is copied into every tick."""
    batch = JobBatch(app, definition=True)
    signature = app.signature(signature) if not isinstance(signature, Signature) else signature
    signature.clone().apply_async(
        producer=batch,
        add_to_parent=False,
        task_id=f"{masters.master_id(business_key)}@template",
        **options,
    )
    [template] = batch.jobs
    return template


def occurrence(master: ClaimedJob, spec: MasterSpec, fire: datetime) -> NewJob:
    """The job of one fire time: the master's message with its own id, and the fire time
    as its ETA, which the task sees as ``self.request.eta``."""
    job_id = masters.occurrence_id(master.job_id, fire)
    headers = kjson.loads(master.message.headers)
    expires = (
        fire + timedelta(seconds=spec.expires_seconds) if spec.expires_seconds is not None else None
    )
    headers.update(
        id=job_id,
        root_id=job_id,
        parent_id=None,
        eta=fire.isoformat(),
        expires=expires.isoformat() if expires else None,
    )
    properties = kjson.loads(master.message.properties)
    properties["correlation_id"] = job_id
    _sent_as_a_tick(master, spec.queue, headers, properties)
    return NewJob(
        job_id=job_id,
        task_name=master.task_name,
        queue=spec.queue,
        priority=master.priority,
        message=Message(
            payload=master.message.payload,
            content_type=master.message.content_type,
            content_encoding=master.message.content_encoding,
            headers=str(kjson.dumps(headers)),
            properties=str(kjson.dumps(properties)),
        ),
        due=fire,
        expires_at=expires,
        root_id=job_id,
        # The template went through the send path: its ratchet options name the resource.
        # The master itself holds no permit; each occurrence needs one.
        resource=(headers.get(HEADER) or {}).get("resource"),
        tags=spec.tags,
    )


def _sent_as_a_tick(
    master: ClaimedJob, queue: str, headers: dict[str, Any], properties: dict[str, Any]
) -> None:
    """Each tick is a send, as each of beat's is: Celery's publish signals fire for it where
    the worker makes it, and what receivers write into its headers (OpenTelemetry's: the
    context of a send span of its own, so each tick is a trace of its own) goes into its
    row. Both fire before the fire's transaction writes the row, one right after the other,
    so that no receiver's state (a current span) is left open across ticks."""
    before, after = signals.before_task_publish, signals.after_task_publish
    if not (before.has_listeners(master.task_name) or after.has_listeners(master.task_name)):
        return
    message = master.message
    body = KombuMessage(
        body=message.payload,
        content_type=message.content_type,
        content_encoding=message.content_encoding,
        headers=headers,
        accept={message.content_type},
    ).decode()
    before.send(
        sender=master.task_name, body=body, exchange="", routing_key=queue, declare=[],
        headers=headers, properties=properties, retry_policy=None,
    )  # fmt: skip
    after.send(sender=master.task_name, body=body, headers=headers, exchange="", routing_key=queue)


def register_all(app: Celery) -> list[str]:
    """Register every ``@recurring`` task and every ``beat_schedule`` entry of ``app``."""
    keys = []
    for task in list(app.tasks.values()):
        options: RecurringOptions | None = getattr(task, _ATTR, None)
        if options is None:
            continue
        if not options.enabled:  # switched off in code: stop a master registered before
            with contextlib.suppress(LookupError, ValueError):
                masters.cancel(ratchet_state(app).store, options.id or task.name)
            continue
        send_options: dict[str, Any] = {}
        if options.priority is not None:
            send_options["priority"] = options.priority
        if options.timeout_seconds:
            send_options["time_limit"] = options.timeout_seconds
        keys.append(
            schedule_recurring(
                app,
                options.cron,
                options.zone,
                task.si(),
                business_key=options.id or task.name,
                misfire=MisfirePolicy.named(
                    options.misfire_policy, options.max_catch_up_executions
                ),
                tags=options.tags,
                options=send_options,
                name=options.name or _function_name(task),
            )
        )
    beat = dict(app.conf.beat_schedule or {})
    keys.extend(_register_beat_schedule(app, beat))
    remove_gone_beat_entries(app, beat)
    return keys


def _register_beat_schedule(app: Celery, beat: dict[str, Any]) -> list[str]:
    """Every entry checked before any is written: one that cannot be registered refuses the
    whole ``beat_schedule`` (one ConfigurationError naming each such entry), changing
    nothing, as a worker that starts with it must not run half of its schedule."""
    prepared, problems = [], []
    for name, entry in beat.items():
        try:
            prepared.append((name, entry, _prepared_beat_entry(app, name, entry)))
        except ConfigurationError as exc:
            problems.append(str(exc))
    if len(problems) == 1:
        raise ConfigurationError(problems[0])
    if problems:
        raise ConfigurationError(
            f"{len(problems)} beat_schedule entries cannot be registered:\n  "
            + "\n  ".join(problems)
        )
    for name, entry, registration in prepared:
        _write(app, registration)
        for warning in _beat_entry_warnings(app, name, entry):
            logger.warning("ratchet: %s", warning)
    return list(beat)


#: The origin of the masters registered from ``beat_schedule``: owned by it.
BEAT_ORIGIN = "beat_schedule"


def remove_gone_beat_entries(app: Celery, entries: dict[str, Any]) -> list[str]:
    """Remove the schedules registered from ``beat_schedule`` entries it no longer has, as
    a restarted ``celery beat`` forgets them; each is logged by name. Only those no running
    worker's ``beat_schedule`` has either: during a rolling deploy, workers of two releases
    run side by side, and neither removes the entries of the other (see
    :func:`beat_entries_gone`). Schedules of ``@recurring`` and of ``schedule_recurring`` are
    never touched: only those counted and named at INFO, so that a start names every
    schedule that goes on firing."""
    store = ratchet_state(app).store
    held = _held_by_workers(store)
    if held is not None:
        removed = masters.remove_gone(store, BEAT_ORIGIN, set(entries) | held)
    else:
        removed = []
    for key in removed:
        logger.warning(
            "ratchet: recurring job %s removed: it was registered from beat_schedule, "
            "which no longer has that entry",
            key,
        )
    kept = [key for key in _registered_beat_keys(store) if key not in entries]
    if kept:
        logger.info(
            "ratchet: recurring jobs %s stay, though this beat_schedule does not have them: "
            "%s; each is removed once no running worker's beat_schedule has it",
            ", ".join(kept),
            "a running worker's beat_schedule has them"
            if held is not None
            else "a worker of an earlier version runs, whose beat_schedule is not known",
        )
    others = masters.keys_by_origin(store).get(None, [])
    if others:
        shown = ", ".join(others[:_OTHERS_NAMED]) + (", ..." if len(others) > _OTHERS_NAMED else "")
        logger.info(
            "ratchet: %d recurring jobs registered through the API or @recurring stay "
            "(not beat_schedule's to remove): %s",
            len(others),
            shown,
        )
    return removed


def beat_entries_gone(app: Celery, entries: dict[str, Any]) -> list[str]:
    """The registered beat_schedule entries that neither ``entries`` nor a running worker's
    beat_schedule has (a dry run of :func:`remove_gone_beat_entries`)."""
    store = ratchet_state(app).store
    held = _held_by_workers(store)
    if held is None:
        return []
    return [key for key in _registered_beat_keys(store) if key not in entries and key not in held]


def beat_entries_kept(app: Celery, entries: dict[str, Any]) -> list[str]:
    """The registered beat_schedule entries ``entries`` does not have: those a running
    worker's beat_schedule has, once :func:`remove_gone_beat_entries` ran."""
    return [k for k in _registered_beat_keys(ratchet_state(app).store) if k not in entries]


def _registered_beat_keys(store: Any) -> list[str]:
    return masters.keys_by_origin(store).get(BEAT_ORIGIN, [])


def _held_by_workers(store: Any) -> set[str] | None:
    """The entries the running workers' beat_schedules have (each says them in its node
    row); None when one of them does not say (a worker of an earlier version)."""
    said = store.node_schedule_keys().values()
    if any(keys is None for keys in said):
        return None
    return {key for keys in said for key in keys}


class BeatOwnership:
    """beat_schedule's ownership kept up while a worker runs, in its housekeeping.

    Once, after the worker registered: its own entries removed since its start are
    registered again (a worker of another release may have removed one between this one's
    start and its node row). Then, whenever a worker that had an entry no running worker's
    beat_schedule has any more left the cluster (stopped, or declared dead), the entries no
    running worker's beat_schedule has are removed: the last worker of a release that had an
    entry takes it along, without waiting for a start. Each pass reads the node rows only."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._said: dict[str, list[str] | None] | None = None

    def __call__(self) -> None:
        entries = dict(self.app.conf.beat_schedule or {})
        store = ratchet_state(self.app).store
        said = store.node_schedule_keys()
        first, seen, self._said = self._said is None, self._said or {}, said
        if first:
            active = {m["business_key"] for m in store.list_masters()}
            for name, entry in entries.items():
                if name not in active:
                    with contextlib.suppress(ConfigurationError):  # said at the start
                        register_beat_entry(self.app, name, entry)
                        logger.warning(
                            "ratchet: recurring job %s registered again: it was removed "
                            "while this worker started, and its beat_schedule has it",
                            name,
                        )
        left = [keys for node, keys in seen.items() if node not in said]
        held = {key for keys in said.values() for key in keys or ()}
        orphaned = any(keys is None or set(keys) - held - set(entries) for keys in left)
        if first or orphaned:
            remove_gone_beat_entries(self.app, entries)


#: Schedules of the API named at a worker's start; the rest are counted.
_OTHERS_NAMED = 20


def _function_name(task: Any) -> str:
    """The seeds' default name of a recurring job: its method's (here, its function's)."""
    return str(getattr(task.run, "__name__", None) or task.name.rpartition(".")[2])


@dataclass(frozen=True)
class BeatEntryCheck:
    """A ``beat_schedule`` entry checked as its registration checks it: what it becomes
    (``cron:<Quartz>`` or ``every:<seconds>``, and its misfire policy) and what is worth a
    warning (its task not registered in this app)."""

    description: str
    warnings: tuple[str, ...]


def check_beat_entry(app: Celery, name: str, entry: dict[str, Any]) -> BeatEntryCheck:
    """Every check the registration of a ``beat_schedule`` entry makes, with nothing
    written (``import-beat --dry-run``); ConfigurationError naming the entry when one fails."""
    return _checked(app, name, entry, _prepared_beat_entry(app, name, entry))


def register_beat_entry(app: Celery, name: str, entry: dict[str, Any]) -> BeatEntryCheck:
    """Register a ``beat_schedule`` entry (after the checks of :func:`check_beat_entry`)."""
    registration = _prepared_beat_entry(app, name, entry)
    _write(app, registration)
    return _checked(app, name, entry, registration)


def _checked(
    app: Celery, name: str, entry: dict[str, Any], registration: _Registration
) -> BeatEntryCheck:
    spec = registration.spec
    kind, _, value = spec.schedule.partition(":")
    shown = f"every:{float(value):g}" if kind == "every" else f"cron:{value}"
    return BeatEntryCheck(
        f"{shown}, misfire {spec.misfire.lower()}", _beat_entry_warnings(app, name, entry)
    )


def _beat_entry_warnings(app: Celery, name: str, entry: dict[str, Any]) -> tuple[str, ...]:
    task = entry["task"]
    if task in app.tasks:
        return ()
    # Not refused: a task of another release (a rolling deploy) is run by its workers, and
    # a worker without it hands each tick back for them, as it does any unknown task's job.
    grace = ratchet_state(app).settings.unknown_task_grace_seconds
    return (
        f"beat_schedule entry {name!r}: task {task!r} is not registered in this app; each "
        "tick is enqueued all the same and runs on a worker that has it (during a rolling "
        "deploy, one of another release); a worker without it hands the tick back for "
        f"{grace:g}s (ratchet_unknown_task_grace_seconds), then fails it as NotRegistered. "
        "Check the task name, or import its module in the worker (include=, imports=, "
        "autodiscover_tasks)",
    )


def _prepared_beat_entry(app: Celery, name: str, entry: dict[str, Any]) -> _Registration:
    """The entry checked and made into its master row, nothing written. Each refusal is a
    ConfigurationError naming the entry; an unreachable or busy store is not a refusal."""
    when = _beat_schedule_text(name, entry)
    options = dict(entry.get("options") or {})
    misfire = beat_misfire(name, options)
    kind, _, value = when.partition(":")
    try:
        signature = app.signature(
            entry["task"],
            args=tuple(entry.get("args") or ()),
            kwargs=dict(entry.get("kwargs") or {}),
        )
        return _prepare(
            app,
            value if kind == "cron" else None,
            _zone_name(app),
            signature,
            business_key=name,
            misfire=misfire,
            tags=(),
            options=options,
            name=name,
            every=float(value) if kind == "every" else None,
            origin=BEAT_ORIGIN,
        )
    except (StoreUnavailable, StoreBusy):
        raise
    except EncodeError as exc:
        # The encoder's message names the type it cannot encode, never a value.
        raise ConfigurationError(
            f"beat_schedule entry {name!r}: its args or kwargs cannot be serialised ({exc}); "
            "give values the task's serializer can encode (JSON: str, int, float, bool, None, "
            "lists and dicts of them)"
        ) from exc
    except (RatchetError, ValueError, TypeError) as exc:
        raise ConfigurationError(f"beat_schedule entry {name!r}: {exc}") from exc


def _beat_schedule_text(name: str, entry: dict[str, Any]) -> str:
    when = entry.get("schedule")
    if "task" not in entry or when is None:
        missing = "task" if "task" not in entry else "schedule"
        raise ConfigurationError(f"beat_schedule entry {name!r} has no {missing!r}")
    if isinstance(when, crontab):
        return f"cron:{crontab_to_quartz(when, name)}"
    if isinstance(when, (int, float, timedelta)) or type(when) is interval_schedule:
        period = when.run_every if isinstance(when, interval_schedule) else when
        seconds = period.total_seconds() if isinstance(period, timedelta) else float(period)
        if not seconds > 0:
            raise ConfigurationError(
                f"beat_schedule entry {name!r}: its interval must be positive, got "
                f"{seconds:g} seconds; give the schedule as seconds above 0 or a timedelta"
            )
        return f"every:{seconds!r}"
    raise ConfigurationError(
        f"beat_schedule entry {name!r}: a {type(when).__name__} schedule cannot be converted "
        "(celery_ratchet runs crontab and interval schedules); use a Quartz cron expression "
        "with celery_ratchet.schedule_recurring instead"
    )


def beat_misfire(name: str, options: dict[str, Any]) -> MisfirePolicy:
    """A beat entry's misfire policy: what celery beat does (an overdue entry runs once,
    then goes on from now: ``fire_once``) unless its ``options`` say ``misfire_policy``
    (and ``max_catch_up_executions``), which are taken out of the send options."""
    policy = options.pop("misfire_policy", None)
    count = options.pop("max_catch_up_executions", None)
    if policy is None:
        if count is not None:
            raise ConfigurationError(
                f"beat_schedule entry {name!r}: max_catch_up_executions needs "
                "misfire_policy='catch_up' in the entry's options"
            )
        return MisfirePolicy.fire_once()
    try:
        return MisfirePolicy.named(str(policy), DEFAULT_CATCH_UP if count is None else int(count))
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"beat_schedule entry {name!r}: {exc}") from None


def _zone_name(app: Celery) -> str:
    zone = app.timezone
    return str(getattr(zone, "key", None) or "UTC")


def crontab_to_quartz(entry: crontab, name: str = "crontab") -> str:
    """Celery's crontab (5 fields, day_of_week 0=Sunday) as a Quartz expression."""

    def listed(values: set[int], full: range) -> str:
        return "*" if set(values) == set(full) else ",".join(str(v) for v in sorted(values))

    minute = listed(entry.minute, range(60))
    hour = listed(entry.hour, range(24))
    month = listed(entry.month_of_year, range(1, 13))
    every_day_of_month = set(entry.day_of_month) == set(range(1, 32))
    every_weekday = set(entry.day_of_week) == set(range(7))
    if not every_day_of_month and not every_weekday:
        raise ConfigurationError(
            f"beat_schedule entry {name!r}: the crontab restricts both day_of_month and "
            "day_of_week, which Quartz cron cannot combine; split it into two entries"
        )
    if every_weekday:
        dom, dow = listed(entry.day_of_month, range(1, 32)), "?"
    else:
        dom, dow = "?", ",".join(str(d + 1) for d in sorted(entry.day_of_week))
    return f"0 {minute} {hour} {dom} {month} {dow}"
