"""beat_schedule owns the schedules it registered: an entry gone from it is removed at the
next start, schedules of the API are never touched; a beat entry misfires as beat does."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from celery import Celery
from celery.schedules import crontab
from kombu.utils import json as kjson

import celery_ratchet
from celery_ratchet.celery.schedules.recurring import BeatOwnership, register_all
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.errors import ConfigurationError
from celery_ratchet.runtime.recurring import master_id
from celery_ratchet.store.jobstore import JobStore
from tests.integration.conftest import BrokerTrap, make_app


@pytest.fixture
def beat_app(store: JobStore, broker_trap: BrokerTrap) -> Celery:
    app = make_app(store.url, broker_trap.url)
    app.conf.beat_schedule = {
        "every-minute": {"task": "t.add", "schedule": timedelta(minutes=1), "args": (1, 2)},
        "nightly": {"task": "t.add", "schedule": crontab(minute=0, hour=2), "args": (3, 4)},
    }
    return app


def _masters(app: Celery) -> dict[str, dict[str, object]]:
    store = ratchet_state(app).store
    return {m["business_key"]: m for m in store.list_masters(include_cancelled=True)}


def test_an_entry_gone_from_beat_schedule_is_removed_and_api_schedules_stay(
    beat_app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    add = beat_app.tasks["t.add"]
    celery_ratchet.schedule_recurring(
        beat_app, "0 0 * * * ?", "UTC", add.si(5, 6), business_key="api-hourly"
    )
    # Named like a beat entry, registered through the API: still not beat_schedule's.
    celery_ratchet.schedule_recurring(
        beat_app, None, "UTC", add.si(7, 8), business_key="old-entry", every=60
    )
    assert sorted(register_all(beat_app)) == ["every-minute", "nightly"]
    del beat_app.conf.beat_schedule["nightly"]
    with caplog.at_level(logging.INFO, logger="celery_ratchet"):
        register_all(beat_app)
    masters = _masters(beat_app)
    assert masters["nightly"]["status"] == JobStatus.REVOKED.value
    for kept in ("every-minute", "api-hourly", "old-entry"):
        assert masters[kept]["status"] == JobStatus.PENDING.value, kept
    removed = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in removed] == [
        "ratchet: recurring job nightly removed: it was registered from beat_schedule, "
        "which no longer has that entry"
    ]
    assert any(
        "2 recurring jobs registered through the API" in r.getMessage()
        and "api-hourly, old-entry" in r.getMessage()
        for r in caplog.records
    )
    # Back in the configuration: registered again (revived), owned again.
    beat_app.conf.beat_schedule["nightly"] = {
        "task": "t.add",
        "schedule": crontab(minute=0, hour=3),
        "args": (3, 4),
    }
    register_all(beat_app)
    assert _masters(beat_app)["nightly"]["status"] == JobStatus.PENDING.value


def test_an_emptied_beat_schedule_removes_every_entry_it_registered(beat_app: Celery) -> None:
    register_all(beat_app)
    beat_app.conf.beat_schedule = {}
    register_all(beat_app)
    statuses = {k: m["status"] for k, m in _masters(beat_app).items()}
    assert statuses == {"every-minute": "REVOKED", "nightly": "REVOKED"}


def test_an_entry_a_running_workers_beat_schedule_has_is_removed_only_once_none_has_it(
    beat_app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """Two releases side by side: a worker of the other one (its node row says its entries)
    keeps an entry this beat_schedule no longer has; a worker of an earlier version, which
    does not say, keeps them all; once they leave, the housekeeping pass removes it."""
    store = ratchet_state(beat_app).store
    register_all(beat_app)
    store.register_node("other-release", "h", 1, ["celery"], 1, ["every-minute", "nightly"])
    store.register_node("earlier-version", "h", 2, ["celery"], 1)
    beat_app.conf.beat_schedule = {}
    with caplog.at_level(logging.INFO, logger="celery_ratchet"):
        register_all(beat_app)
    assert {m["status"] for m in _masters(beat_app).values()} == {"PENDING"}
    assert "a worker of an earlier version runs" in caplog.text
    ownership = BeatOwnership(beat_app)
    store.remove_node("earlier-version")
    ownership()  # its first pass: the other release's worker still has both
    assert {m["status"] for m in _masters(beat_app).values()} == {"PENDING"}
    ownership()  # nobody left: nothing looked at again
    store.register_node("other-release", "h", 1, ["celery"], 1, ["every-minute"])
    store.remove_node("other-release")
    with caplog.at_level(logging.WARNING, logger="celery_ratchet"):
        ownership()
    statuses = {k: m["status"] for k, m in _masters(beat_app).items()}
    assert statuses == {"every-minute": "REVOKED", "nightly": "REVOKED"}


def test_a_workers_own_entry_removed_while_it_started_is_registered_again(
    beat_app: Celery,
) -> None:
    register_all(beat_app)
    # Another release's worker removed it in the moment before this one's node row said it.
    celery_ratchet.cancel_recurring(beat_app, "nightly")
    BeatOwnership(beat_app)()
    assert _masters(beat_app)["nightly"]["status"] == JobStatus.PENDING.value


def test_a_beat_entry_misfires_as_beat_does_unless_its_options_say_otherwise(
    beat_app: Celery,
) -> None:
    beat_app.conf.beat_schedule["caught-up"] = {
        "task": "t.add",
        "schedule": 2.0,
        "args": (1, 1),
        "options": {"misfire_policy": "catch_up", "max_catch_up_executions": 3, "priority": 7},
    }
    register_all(beat_app)
    masters = _masters(beat_app)
    specs = {k: MasterSpec.from_json(str(m["schedule_spec"])) for k, m in masters.items()}
    assert specs["every-minute"].misfire == "FIRE_ONCE"
    assert specs["nightly"].misfire == "FIRE_ONCE"
    assert specs["caught-up"].misfire == "CATCH_UP:3"
    assert {s.origin for s in specs.values()} == {"beat_schedule"}
    # The misfire options are the schedule's, not the message's; the others are sent.
    store = ratchet_state(beat_app).store
    record = store.result(master_id("caught-up"))
    assert record is not None
    assert "misfire" not in kjson.dumps(kjson.loads(record.headers or "{}"))
    assert masters["caught-up"]["priority"] == 7


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"misfire_policy": "later"}, r"'bad'.*unknown misfire policy 'later'"),
        ({"max_catch_up_executions": 3}, r"'bad'.*needs misfire_policy='catch_up'"),
        ({"misfire_policy": "catch_up", "max_catch_up_executions": 0}, r"'bad'.*at least 1"),
    ],
)
def test_a_wrong_misfire_option_is_refused_naming_the_entry(
    beat_app: Celery, options: dict[str, object], said: str
) -> None:
    beat_app.conf.beat_schedule = {"bad": {"task": "t.add", "schedule": 5, "options": options}}
    with pytest.raises(ConfigurationError, match=said):
        register_all(beat_app)


def test_a_beat_schedule_with_entries_that_cannot_be_registered_changes_nothing(
    beat_app: Celery,
) -> None:
    """Each refused entry named in one error, and not one entry written: a worker does not
    start on half of its schedule."""
    beat_app.conf.beat_schedule.update(
        {
            "backwards": {"task": "t.add", "schedule": -5, "args": (1, 2)},
            "never": {"task": "t.add", "schedule": timedelta(0), "args": (1, 2)},
            "opaque": {"task": "t.add", "schedule": 60, "args": (object(), 2)},
        }
    )
    with pytest.raises(ConfigurationError) as refused:
        register_all(beat_app)
    said = str(refused.value)
    assert said.startswith("3 beat_schedule entries cannot be registered:")
    assert "'backwards': its interval must be positive, got -5 seconds" in said
    assert "'never': its interval must be positive, got 0 seconds" in said
    assert "'opaque': its args or kwargs cannot be serialised" in said
    assert _masters(beat_app) == {}


def test_an_entry_whose_task_the_app_does_not_have_is_registered_with_a_warning(
    beat_app: Celery, caplog: pytest.LogCaptureFixture
) -> None:
    """A task of another release's workers is legitimate (its ticks run there): a warning
    that says what becomes of its ticks elsewhere, as the hand-over grace does."""
    beat_app.conf.beat_schedule["typo"] = {"task": "t.ad", "schedule": 60}
    with caplog.at_level(logging.WARNING, logger="celery_ratchet"):
        register_all(beat_app)
    assert _masters(beat_app)["typo"]["status"] == JobStatus.PENDING.value
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith(
        "ratchet: beat_schedule entry 'typo': task 't.ad' is not registered in this app"
    )
    assert "ratchet_unknown_task_grace_seconds" in warning


def test_schedules_of_the_api_and_of_recurring_keep_their_spec_text(beat_app: Celery) -> None:
    """A schedule with no origin is stored as before this field existed: registering it again
    after an upgrade is no change, which would move its next fire time."""
    spec = MasterSpec("every:60")
    assert "origin" not in spec.to_json()
    assert MasterSpec.from_json(spec.to_json()) == spec
    owned = MasterSpec("every:60", origin="beat_schedule")
    assert MasterSpec.from_json(owned.to_json()) == owned
