"""The two names of Flower that celery_ratchet.celery.control.flower replaces, one test each, so
that a Flower release that moves one fails the test named after it; and what the hooks leave
alone."""

from __future__ import annotations

import importlib
from typing import Any

import celery
import pytest
from celery.events.receiver import EventReceiver

from celery_ratchet.celery.control import flower as hooks
from celery_ratchet.celery.control.events import RatchetEventReceiver
from tests.conftest import IN_CI


def _flower(module: str) -> Any:
    if not IN_CI:
        pytest.importorskip("flower", reason="Flower is in the test extra")
    return importlib.import_module(module)


def test_flower_reads_events_with_celerys_receiver_class_named_in_flower_events() -> None:
    events = _flower("flower.events")
    assert events.EventReceiver in (EventReceiver, hooks.event_receiver)


def test_flower_asks_its_handlers_get_broker_for_queue_lengths() -> None:
    views = _flower("flower.views")
    assert callable(views.BaseHandler.get_broker)


def test_hooks_install_once_and_keep_stock_behaviour_for_other_apps() -> None:
    _flower("flower.app")
    views = importlib.import_module("flower.views")
    assert hooks.install_hooks() is True
    hooked = views.BaseHandler.get_broker
    assert hooks.install_hooks() is True
    assert views.BaseHandler.get_broker is hooked
    assert importlib.import_module("flower.events").EventReceiver is hooks.event_receiver

    stock = celery.Celery("stock", broker="memory://", set_as_current=False)
    with stock.connection() as conn:
        receiver = hooks.event_receiver(conn, handlers={}, app=stock)
    assert type(receiver) is EventReceiver


def test_a_ratchet_apps_receiver_is_its_own(tmp_path: Any) -> None:
    _flower("flower.app")
    from celery_ratchet import Celery

    app = Celery("hooked", set_as_current=False)
    app.conf.ratchet_url = f"sqlite:///{tmp_path / 'r.db'}"
    with app.connection() as conn:
        receiver = hooks.event_receiver(conn, handlers={}, app=app)
    assert isinstance(receiver, RatchetEventReceiver)
