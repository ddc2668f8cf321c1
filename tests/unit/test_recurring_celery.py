"""Turning Celery's schedules and decorated tasks into recurring masters."""

from __future__ import annotations

import pytest
from celery import Celery
from celery.schedules import BaseSchedule, crontab

import celery_ratchet
from celery_ratchet.celery.schedules.recurring import crontab_to_quartz, register_beat_entry
from celery_ratchet.domain.cron import CronError, CronExpression
from celery_ratchet.errors import ConfigurationError


@pytest.mark.parametrize(
    ("entry", "quartz"),
    [
        (crontab(), "0 * * * * ?"),
        (crontab(minute="*/15"), "0 0,15,30,45 * * * ?"),
        (crontab(minute=0, hour="2"), "0 0 2 * * ?"),
        (crontab(minute=30, hour=9, day_of_week="mon-fri"), "0 30 9 ? * 2,3,4,5,6"),
        (crontab(minute=0, hour=0, day_of_week="sun"), "0 0 0 ? * 1"),
        (crontab(minute=0, hour=0, day_of_month="1,15"), "0 0 0 1,15 * ?"),
        (crontab(minute=0, hour=6, month_of_year="jan,jul", day_of_month=1), "0 0 6 1 1,7 ?"),
    ],
)
def test_celery_crontab_becomes_quartz(entry: crontab, quartz: str) -> None:
    assert crontab_to_quartz(entry) == quartz
    CronExpression(quartz)  # and Quartz accepts it


def test_crontab_restricting_both_days_is_refused_by_name() -> None:
    with pytest.raises(ConfigurationError, match=r"'payday'.*both day_of_month and day_of_week"):
        crontab_to_quartz(crontab(day_of_month=1, day_of_week="mon"), "payday")


class Sunrise(BaseSchedule):
    """Stands in for celery.schedules.solar, which needs the optional ephem package."""


def test_unconvertible_schedules_are_refused_naming_the_entry() -> None:
    app = Celery("t", set_as_current=False)
    entry = {"task": "x", "schedule": Sunrise()}
    with pytest.raises(ConfigurationError, match=r"'dawn'.*Sunrise schedule cannot be converted"):
        register_beat_entry(app, "dawn", entry)


def test_recurring_checks_its_arguments_at_import() -> None:
    app = Celery("t", task_cls="celery_ratchet:RatchetTask", set_as_current=False)
    with pytest.raises(CronError, match="second"):
        celery_ratchet.recurring(cron="61 * * * * ?")
    with pytest.raises(ValueError, match="misfire"):
        celery_ratchet.recurring(cron="0 * * * * ?", misfire_policy="later")

    with pytest.raises(TypeError, match=r"must take no arguments.*needs customer"):

        @celery_ratchet.recurring(cron="0 * * * * ?")
        @app.task(name="t.bill", shared=False)
        def bill(customer: str) -> None: ...

    @celery_ratchet.recurring(cron="0 * * * * ?", id="hourly")
    @app.task(name="t.bound", bind=True, shared=False)
    def bound(self: object) -> None: ...

    assert app.tasks["t.bound"].ratchet_recurring.id == "hourly"


def test_recurring_tasks_retry_as_the_seeds_say() -> None:
    app = Celery("t", task_cls="celery_ratchet:RatchetTask", set_as_current=False)

    @celery_ratchet.recurring(
        cron="0 * * * * ?", max_retries=5, backoff_policy="fixed", backoff_delay_ms=2500
    )
    @app.task(name="t.fixed", shared=False)
    def fixed() -> None: ...

    @celery_ratchet.recurring(cron="0 * * * * ?", max_retries=0)
    @app.task(name="t.no_retry", shared=False)
    def no_retry() -> None: ...

    # Ratchet's own retry options, decided to the millisecond (not Celery's autoretry).
    task = app.tasks["t.fixed"]
    assert (task.max_retries, task.backoff, task.backoff_param) == (5, "fixed", 2.5)
    assert not getattr(task, "autoretry_for", ())
    assert app.tasks["t.no_retry"].backoff is None
    with pytest.raises(ValueError, match="backoff_policy"):

        @celery_ratchet.recurring(cron="0 * * * * ?", backoff_policy="linear")
        @app.task(name="t.linear", shared=False)
        def linear() -> None: ...


def test_occurrences_expire_relative_to_their_own_fire_time() -> None:
    from datetime import datetime, timezone

    from celery_ratchet.celery.schedules.recurring import occurrence
    from celery_ratchet.domain.job import ClaimedJob, JobType
    from celery_ratchet.domain.schedule import MasterSpec
    from tests.helpers import new_job

    template = new_job("recurring:k@template")
    master = ClaimedJob(
        id=1,
        job_id="recurring:k",
        task_name="tests.add",
        queue="x",
        priority=4,
        attempts=0,
        claims=1,
        token="t",
        scheduled_time=datetime(2026, 1, 1, tzinfo=timezone.utc),
        message=template.message,
        job_type=JobType.RECURRING,
    )
    fire = datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc)
    spec = MasterSpec("cron:0 0 12 * * ?", expires_seconds=50)
    job = occurrence(master, spec, fire)
    assert job.job_id == "recurring:k@2026-05-01T12:00:00+00:00"
    assert job.expires_at == fire.replace(second=50)
    assert (job.due, job.queue) == (fire, "celery")
    assert occurrence(master, MasterSpec("cron:0 0 12 * * ?"), fire).expires_at is None


def test_business_keys_must_fit_the_occurrence_ids() -> None:
    from celery_ratchet.domain.schedule import MasterSpec
    from celery_ratchet.runtime import recurring as masters
    from tests.helpers import new_job

    with pytest.raises(ValueError, match="1-219 characters"):
        masters.register(
            None,
            "k" * 220,
            MasterSpec("every:1"),  # type: ignore[arg-type]
            task_name="t",
            priority=4,
            message=new_job("x").message,
        )
