"""A Celery app with a beat_schedule, for ``celery -A … ratchet import-beat``."""

from __future__ import annotations

import os
from datetime import timedelta

from celery import Celery
from celery.schedules import crontab, schedule

app = Celery("beat_app", task_cls="celery_ratchet:RatchetTask")
app.conf.broker_url = "amqp://guest:guest@127.0.0.1:1//"  # closed: never contacted
app.conf.ratchet_url = os.environ["RATCHET_URL"]
app.conf.timezone = "Europe/London"
app.conf.beat_schedule = {
    "nightly-report": {"task": "beat.report", "schedule": crontab(minute=30, hour=2)},
    "heartbeat": {"task": "beat.report", "schedule": timedelta(minutes=15), "args": (1,)},
}


# An entry dropped from the configuration (BEAT_APP_WITHOUT=heartbeat): import-beat removes it.
for _gone in filter(None, os.environ.get("BEAT_APP_WITHOUT", "").split(",")):
    del app.conf.beat_schedule[_gone]


class BusinessDays(schedule):
    """A custom schedule class: nothing celery_ratchet can convert."""


if os.environ.get("BEAT_APP_CUSTOM"):
    app.conf.beat_schedule["weekdays"] = {
        "task": "beat.report", "schedule": BusinessDays(timedelta(days=1)),
    }  # fmt: skip


# Entries the registration refuses (BEAT_APP_REFUSED=1): each is named, the dry run too.
if os.environ.get("BEAT_APP_REFUSED"):
    app.conf.beat_schedule["backwards"] = {"task": "beat.report", "schedule": -5}
    app.conf.beat_schedule["opaque"] = {
        "task": "beat.report", "schedule": 60, "args": (object(),),
    }  # fmt: skip

# An entry whose task this app does not have (BEAT_APP_UNKNOWN=1): warned about, registered.
if os.environ.get("BEAT_APP_UNKNOWN"):
    app.conf.beat_schedule["typo"] = {"task": "beat.reprot", "schedule": 60}


@app.task(name="beat.report")
def report(n: int = 0) -> int:
    return n
