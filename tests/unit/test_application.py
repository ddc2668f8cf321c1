"""celery_ratchet.Celery: ratchet is installed when the app is created, before configuration."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import celery_ratchet
from celery_ratchet.celery.app.task import RatchetTask
from celery_ratchet.celery.control.control import RatchetControl
from celery_ratchet.celery.control.events import RatchetEvents
from celery_ratchet.celery.send.amqp import RatchetAMQP
from celery_ratchet.celery.state import NO_BROKER


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


def test_djangos_fixup_keeps_the_ratchet_task_class() -> None:
    pytest.importorskip("django")
    # In a process of its own: Celery's Django fixup connects process-wide signals that
    # would set Django up in every later worker start here.
    check = textwrap.dedent(
        """
        from celery.contrib.django.task import DjangoTask
        import celery_ratchet
        from celery_ratchet.celery.app.task import RatchetTask
        app = celery_ratchet.Celery("shop", set_as_current=False)
        assert issubclass(app.Task, RatchetTask)
        assert not issubclass(app.Task, DjangoTask)
        assert callable(app.Task.delay_on_commit)
        assert any(type(f).__name__ == "DjangoFixup" for f in app._fixups), app._fixups
        """
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.unit.test_application"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


class Audited(RatchetTask):
    audited = True
