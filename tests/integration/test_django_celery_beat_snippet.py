"""The django-celery-beat conversion of docs/migrating-from-beat.md, run as written against
django-celery-beat's own tables: cron's day-of-week (Sunday 0) becomes Quartz's (Sunday 1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.store.jobstore import JobStore

pytest.importorskip("django_celery_beat")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "migrating-from-beat.md"


def snippet() -> str:
    section = DOC.read_text().split("## From django-celery-beat", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, "the django-celery-beat section has no python block"
    return found.group(1)


#: A Django project with django-celery-beat's tables, holding the schedules to move; then
#: the snippet, with ``shop.celery`` the project's ratchet app.
SCRIPT = """
import os, sys, types
import django
from django.conf import settings

settings.configure(
    SECRET_KEY="test-only", USE_TZ=True, TIME_ZONE="UTC",
    INSTALLED_APPS=["django_celery_beat"],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3",
                           "NAME": os.environ["BEAT_DB"]}},
)
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)

from celery_ratchet import Celery
from django_celery_beat.models import CrontabSchedule, IntervalSchedule, PeriodicTask

app = Celery("shop", set_as_current=False)
app.conf.ratchet_url = os.environ["RATCHET_URL"]
app.conf.broker_url = "amqp://guest:guest@127.0.0.1:1//"

@app.task(name="shop.report")
def report(*args, **kwargs): ...

shop = types.ModuleType("shop"); shop_celery = types.ModuleType("shop.celery")
shop_celery.app = app
sys.modules.update({"shop": shop, "shop.celery": shop_celery})

def crontab(**fields):
    return CrontabSchedule.objects.create(timezone="Europe/London", **fields)

PeriodicTask.objects.create(
    name="sunday-report", task="shop.report", args="[1]",
    crontab=crontab(minute="0", hour="9", day_of_week="0", day_of_month="*"))
PeriodicTask.objects.create(
    name="weekday-report", task="shop.report", kwargs='{"kind": "daily"}', queue="reports",
    crontab=crontab(minute="30", hour="7", day_of_week="1-5", day_of_month="*"))
PeriodicTask.objects.create(
    name="weekend-report", task="shop.report", priority=7,
    crontab=crontab(minute="0", hour="12", day_of_week="sat,sun", day_of_month="*"))
PeriodicTask.objects.create(
    name="monthly-report", task="shop.report",
    crontab=crontab(minute="0", hour="6", day_of_week="*", day_of_month="1"))
PeriodicTask.objects.create(
    name="quarter-hour", task="shop.report",
    interval=IntervalSchedule.objects.create(every=15, period="minutes"))
PeriodicTask.objects.create(
    name="switched-off", task="shop.report", enabled=False,
    interval=IntervalSchedule.objects.create(every=1, period="hours"))
"""


def test_the_django_celery_beat_snippet_moves_each_schedule_with_quartz_weekdays(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'ratchet.db'}"
    script = tmp_path / "move.py"
    script.write_text(SCRIPT + "\n" + textwrap.dedent(snippet()))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={**os.environ, "RATCHET_URL": url, "BEAT_DB": str(tmp_path / "beat.sqlite3"),
             "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    store = JobStore(url)
    masters = {m["business_key"]: m for m in store.list_masters()}
    specs = {key: MasterSpec.from_json(m["schedule_spec"]) for key, m in masters.items()}
    schedules = {key: spec.schedule for key, spec in specs.items()}
    assert schedules == {
        "sunday-report": "cron:0 0 9 ? * 1",
        "weekday-report": "cron:0 30 7 ? * 2,3,4,5,6",
        "weekend-report": "cron:0 0 12 ? * 1,7",
        "monthly-report": "cron:0 0 6 1 * ?",
        "quarter-hour": "every:900.0",
    }
    assert {spec.zone for key, spec in specs.items() if key != "quarter-hour"} == {"Europe/London"}
    assert specs["weekday-report"].queue == "reports"
    assert masters["weekend-report"]["priority"] == 7
    assert {spec.misfire for spec in specs.values()} == {"FIRE_ONCE"}
    # The Sunday report fires on Sundays, at 09:00 London time.
    london = ZoneInfo("Europe/London")
    moment = datetime(2026, 12, 2, tzinfo=timezone.utc)  # a Wednesday
    shown = set()
    for _ in range(4):
        fire = specs["sunday-report"].timetable.next_after(moment)
        assert fire is not None
        shown.add(fire.astimezone(london).strftime("%A %H:%M"))
        moment = fire
    assert shown == {"Sunday 09:00"}
    template = store.result("recurring:sunday-report")
    assert template is not None and template.payload is not None
    assert json.loads(template.payload)[0] == [1]
