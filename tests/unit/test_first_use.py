"""``celery.Celery(task_cls=...)`` apps: ratchet in place before the first send, result read
or control call, whatever the process does first (celery_ratchet.celery.app.first_use)."""

from __future__ import annotations

import itertools
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from celery.app.amqp import AMQP
from celery.app.control import Control
from celery.backends.base import DisabledBackend
from celery.contrib.testing.app import TestApp, setup_default_app

from celery_ratchet.celery.app.first_use import GATED_CLASSES, Undecided
from celery_ratchet.celery.app.task import RatchetTask
from celery_ratchet.celery.control.control import RatchetControl
from celery_ratchet.celery.control.events import RatchetEvents
from celery_ratchet.celery.results.backend import RatchetBackend
from celery_ratchet.celery.send.amqp import RatchetAMQP
from celery_ratchet.celery.state import NO_BROKER, is_installed
from celery_ratchet.errors import ConfigurationError

ROOT = Path(__file__).resolve().parents[2]
CLOSED_BROKER = "amqp://guest@127.0.0.1:1//"
RATCHET_CLASSES = {
    "amqp": RatchetAMQP,
    "backend": RatchetBackend,
    "control": RatchetControl,
    "events": RatchetEvents,
}
_names = itertools.count()


@pytest.fixture
def base_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The name of a module, not imported yet, holding a RatchetTask subclass ``ShopTask``
    and a plain Celery task class ``PlainTask``."""
    name = f"first_use_base_{next(_names)}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from celery import Task
            from celery_ratchet import RatchetTask

            class ShopTask(RatchetTask):
                pass

            class PlainTask(Task):
                pass
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def app_with(task_cls: object) -> Celery:
    return Celery("shop", task_cls=task_cls, broker=CLOSED_BROKER, set_as_current=False)


@pytest.mark.parametrize("task_cls", ["celery_ratchet:RatchetTask", RatchetTask])
def test_an_app_naming_ratchet_task_is_installed_as_it_is_made(task_cls: object) -> None:
    app = app_with(task_cls)
    assert is_installed(app)
    assert not app.configured
    for name, cls in RATCHET_CLASSES.items():
        assert isinstance(getattr(app, name), cls), name
    assert app.conf.broker_url == NO_BROKER
    assert app.conf.result_backend == "ratchet://"


def test_an_app_with_celerys_task_class_is_left_as_celery_makes_it() -> None:
    app = Celery("shop", broker=CLOSED_BROKER, set_as_current=False)
    assert not is_installed(app)
    assert not any(isinstance(getattr(app, attr), Undecided) for attr in GATED_CLASSES)
    assert type(app.amqp) is AMQP
    assert type(app.control) is Control
    assert app.conf.broker_url == CLOSED_BROKER


def test_apps_made_after_celerys_test_app_fixture_are_installed_too() -> None:
    # Celery's fixture puts back a copy of the set it registers apps in when it ends.
    for _ in range(2):
        app = TestApp(set_as_current=False, task_cls="celery_ratchet:RatchetTask")
        with setup_default_app(app):
            assert is_installed(app)
            assert isinstance(app.control, RatchetControl)


@pytest.mark.parametrize("first", sorted(RATCHET_CLASSES))
def test_a_subclass_in_a_module_not_imported_yet_installs_at_the_first_use(
    base_module: str, first: str
) -> None:
    app = app_with(f"{base_module}:ShopTask")
    # Celery resolves task_cls lazily (its module may import the app's): so does ratchet.
    assert base_module not in sys.modules
    assert not is_installed(app)
    assert isinstance(getattr(app, first), RATCHET_CLASSES[first])
    assert is_installed(app)
    for name, cls in RATCHET_CLASSES.items():
        assert isinstance(getattr(app, name), cls), name
    assert app.conf.broker_url == NO_BROKER


def test_a_plain_task_class_in_a_module_not_imported_yet_gets_celerys_classes_back(
    base_module: str,
) -> None:
    app = app_with(f"{base_module}:PlainTask")
    stock = Celery("stock", set_as_current=False)
    assert type(app.amqp) is AMQP
    assert not is_installed(app)
    for attr in GATED_CLASSES:
        assert getattr(app, attr) == getattr(stock, attr), attr
    assert isinstance(app.backend, DisabledBackend)
    assert app.conf.broker_url == CLOSED_BROKER


def test_binding_a_task_first_installs_and_the_rest_follows(base_module: str) -> None:
    app = app_with(f"{base_module}:ShopTask")

    @app.task(name="shop.noop", shared=False)
    def noop() -> None: ...

    assert issubclass(type(noop._get_current_object()), RatchetTask)  # type: ignore[attr-defined]
    assert is_installed(app)
    assert isinstance(app.backend, RatchetBackend)
    assert not any(isinstance(getattr(app, attr), Undecided) for attr in GATED_CLASSES)


def test_a_task_class_that_cannot_be_imported_fails_the_first_send_loudly() -> None:
    app = app_with("no_such_module_here:ShopTask")
    with pytest.raises(ConfigurationError, match="'no_such_module_here:ShopTask' cannot be"):
        app.send_task("shop.charge")
    with pytest.raises(ConfigurationError, match="cannot be imported"):
        app.AsyncResult("some-id").get(timeout=1)


def test_an_undecided_app_unpickles_undecided_and_decides_the_same(base_module: str) -> None:
    app = app_with(f"{base_module}:ShopTask")
    copy = pickle.loads(pickle.dumps(app))
    assert not is_installed(copy)
    assert isinstance(copy.control, RatchetControl)
    assert is_installed(copy)
    assert not is_installed(app)


def test_what_kombu_loads_while_celery_is_imported_is_light_and_registers_no_codec() -> None:
    # Every Celery process of an environment with celery_ratchet installed runs it.
    check = textwrap.dedent(
        """
        import sys
        import celery_ratchet.celery.app.autoload as autoload
        heavy = {"celery.app.base", "sqlalchemy", "kombu.serialization"} & set(sys.modules)
        assert not heavy, heavy
        from kombu.serialization import registry
        name = "celery-ratchet-autoload"
        content_type = registry.name_to_type[name]
        assert content_type == autoload.KOMBU_SERIALIZER[2], content_type
        assert name not in registry._encoders and content_type not in registry._decoders
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize(
    "first_import",
    ["from celery import Celery", "import kombu.serialization", "import celery.app.base"],
)
def test_a_fresh_process_watches_apps_whatever_it_imports_first(first_import: str) -> None:
    check = textwrap.dedent(
        f"""
        {first_import}
        import sys
        from celery import Celery
        app = Celery("shop", task_cls="celery_ratchet:RatchetTask", set_as_current=False)
        assert app.__dict__.get("_ratchet_installed"), "not installed"
        assert "celery_ratchet.celery.app.install" in sys.modules
        plain = Celery("plain", set_as_current=False)
        assert not plain.__dict__.get("_ratchet_installed")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_stock_app_keeps_celerys_classes_beside_a_ratchet_app_with_shared_tasks() -> None:
    # In a process of its own: the shared task stays on every app made after it. A process
    # in the middle of a migration: a stock app on its broker, and a ratchet app whose task
    # is shared (Celery's default) and has a base class of its own, which Celery makes anew,
    # with that base, on the stock app as it is finalized.
    check = textwrap.dedent(
        f"""
        from celery import Celery
        from celery.app.amqp import AMQP
        from celery.app.control import Control
        from celery.app.events import Events
        from celery.backends.base import DisabledBackend
        from celery_ratchet import RatchetTask

        ratchet = Celery("shop", task_cls="celery_ratchet:RatchetTask", set_as_current=False)

        class ShopTask(ratchet.Task):
            pass

        @ratchet.task(name="shop.noop", base=ShopTask)
        def noop():
            pass

        stock = Celery("stock", broker="{CLOSED_BROKER}", set_as_current=False)
        assert isinstance(stock.tasks["shop.noop"], RatchetTask), "shared task not made anew"
        assert not stock.__dict__.get("_ratchet_installed"), "stock app installed"
        assert type(stock.amqp) is AMQP, stock.amqp
        assert type(stock.control) is Control, stock.control
        assert type(stock.events) is Events, stock.events
        assert type(stock.backend) is DisabledBackend, stock.backend
        assert stock.conf.result_backend is None, stock.conf.result_backend
        assert stock.conf.broker_url == "{CLOSED_BROKER}", stock.conf.broker_url
        assert ratchet.__dict__.get("_ratchet_installed"), "ratchet app not installed"
        assert ratchet.conf.result_backend == "ratchet://", ratchet.conf.result_backend
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", check], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
