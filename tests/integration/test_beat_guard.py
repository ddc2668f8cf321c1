"""``celery beat`` left running on a ratchet app whose workers fire its beat_schedule: it
exits before it sends anything, instead of sending every tick a second time."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from celery import Celery, beat, signals
from celery.schedules import crontab

from celery_ratchet.celery.schedules.beat_guard import EXIT_STATUS, BeatNotNeeded
from tests.conftest import empty_store
from tests.integration.conftest import make_app

ROOT = Path(__file__).resolve().parents[2]
CLOSED_BROKER = "amqp://guest:guest@127.0.0.1:1//"  # never contacted


def test_celery_beat_on_a_ratchet_app_with_beat_schedule_exits_and_sends_nothing(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'beat.db'}"
    store = empty_store(url)
    beat = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.integration.beat_app", "beat",
         "-s", str(tmp_path / "celerybeat-schedule"), "--max-interval", "1"],
        cwd=ROOT,
        env={**os.environ, "RATCHET_URL": url, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert beat.returncode == EXIT_STATUS, beat.stdout + beat.stderr
    said = beat.stdout + beat.stderr
    assert "celery beat is not needed on a ratchet app" in said
    assert "'heartbeat', 'nightly-report'" in said and "Stop the beat service" in said
    assert "Traceback" not in said
    assert store.list_jobs(limit=10) == []


def _service(app: Celery) -> beat.Service:
    return beat.Service(app=app)  # its scheduler is made at start, not here


def _ratchet_app(tmp_path: Path) -> Celery:
    return make_app(f"sqlite:///{tmp_path / 'beat.db'}", CLOSED_BROKER)


def test_beat_without_beat_schedule_entries_runs_and_a_plain_celery_app_is_left_alone(
    tmp_path: Path,
) -> None:
    # A scheduler with entries of its own (django-celery-beat's) is then the only one firing.
    ratchet_app = _ratchet_app(tmp_path)
    ratchet_app.conf.beat_schedule = {}
    signals.beat_init.send(sender=_service(ratchet_app))
    plain = Celery("plain", broker="memory://")
    plain.conf.beat_schedule = {"x": {"task": "t.x", "schedule": crontab()}}
    signals.beat_init.send(sender=_service(plain))


def test_an_embedded_beat_is_stopped_too(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A worker's -B starts its beat with the same signal: its process or thread ends there.
    app = _ratchet_app(tmp_path)
    app.conf.beat_schedule = {"every-minute": {"task": "t.add", "schedule": 60.0}}
    with caplog.at_level(logging.CRITICAL), pytest.raises(BeatNotNeeded) as stopped:
        signals.beat_init.send(sender=_service(app))
    assert stopped.value.code == EXIT_STATUS
    assert "1 beat_schedule entries ('every-minute')" in caplog.text
