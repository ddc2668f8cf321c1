"""celery_ratchet.Celery: ratchet is installed when the app is created, before configuration."""

from __future__ import annotations

import pickle

import pytest

import celery_ratchet
from celery_ratchet.celery.app import NO_BROKER
from celery_ratchet.celery.control import RatchetControl
from celery_ratchet.celery.events import RatchetEvents
from celery_ratchet.celery.sender import RatchetAMQP
from celery_ratchet.celery.task import RatchetTask


def test_app_is_a_ratchet_app_before_any_task_is_bound() -> None:
    app = celery_ratchet.Celery("shop", broker="amqp://guest@127.0.0.1:1//", set_as_current=False)
    assert not app.configured
    assert isinstance(app.amqp, RatchetAMQP)
    assert isinstance(app.control, RatchetControl)
    assert isinstance(app.events, RatchetEvents)
    assert app.conf.broker_url == NO_BROKER
    assert app.conf.result_backend == "ratchet://"
    assert issubclass(app.Task, RatchetTask)


def test_app_unpickled_in_another_process_is_a_ratchet_app_too() -> None:
    app = celery_ratchet.Celery("shop", set_as_current=False)
    app.conf.ratchet_url = "sqlite:///shop.db"
    copy = pickle.loads(pickle.dumps(app))
    assert copy is not app
    assert isinstance(copy.amqp, RatchetAMQP)
    assert copy.conf.ratchet_url == "sqlite:///shop.db"
    assert copy.conf.result_backend == "ratchet://"


def test_task_cls_may_name_a_ratchet_task_subclass() -> None:
    app = celery_ratchet.Celery(
        "shop", task_cls="tests.unit.test_application:Audited", set_as_current=False
    )
    assert issubclass(app.Task, Audited)
    assert isinstance(app.amqp, RatchetAMQP)


def test_djangos_fixup_keeps_the_ratchet_task_class(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("django")
    from celery.contrib.django.task import DjangoTask

    monkeypatch.setenv("DJANGO_SETTINGS_MODULE", "tests.unit.test_application")
    app = celery_ratchet.Celery("shop", set_as_current=False)
    assert issubclass(app.Task, RatchetTask)
    assert not issubclass(app.Task, DjangoTask)
    assert callable(app.Task.delay_on_commit)


class Audited(RatchetTask):
    audited = True
