"""One test per Celery internal named in celery_ratchet.celery.compat."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import click
import pytest
from celery import Celery, Signature
from celery.local import Proxy

from celery_ratchet.celery.compat import (
    DJANGO_TASK_METHODS,
    current_app_object,
    current_task_object,
    django_task_method,
    forget_cached_backend,
    offer_pool,
    on_every_cli_app,
    signature_app,
    unproxied,
    wrap_settings_censor,
)
from celery_ratchet.errors import ConfigurationError


def _app() -> Celery:
    return Celery("compat", set_as_current=False)


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def delay(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("delay", args, kwargs))

    def apply_async(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("apply_async", args, kwargs))


@pytest.mark.parametrize(
    ("name", "sends"), [("delay_on_commit", "delay"), ("apply_async_on_commit", "apply_async")]
)
def test_django_task_method_defers_the_send_to_on_commit(
    name: str, sends: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("django")
    from celery.contrib.django import task as django_task

    deferred: list[Any] = []
    monkeypatch.setattr(django_task.transaction, "on_commit", deferred.append)
    task = _Recorder()

    django_task_method(name)(task, 1, kw=2)

    assert task.calls == []  # nothing is sent before the commit
    assert len(deferred) == 1
    deferred[0]()
    assert task.calls == [(sends, (1,), {"kw": 2})]


def test_django_task_method_without_django_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "celery.contrib.django.task", None)
    for name in DJANGO_TASK_METHODS:
        with pytest.raises(ConfigurationError, match="Django is not installed"):
            django_task_method(name)


def test_django_task_method_names_only_celerys_methods() -> None:
    with pytest.raises(ValueError, match="not one of Celery's Django task methods"):
        django_task_method("delay")


def test_message_ignore_result_overrides_task_follows_the_installed_celery() -> None:
    from importlib.metadata import version

    from celery_ratchet.celery.compat import message_ignore_result_overrides_task

    major, minor = (int(p) for p in version("celery").split(".")[:2])
    assert message_ignore_result_overrides_task() is ((major, minor) >= (5, 6))


# -- the app and Celery's proxies ------------------------------------------------------------


def test_forget_cached_backend_drops_the_backend_in_app_local() -> None:
    app = _app()
    before = app.backend
    app.conf.result_backend = "cache+memory://"
    assert app.backend is before  # cached: the new setting is not seen yet
    forget_cached_backend(app)
    assert type(app.backend).__name__ == "CacheBackend"


def test_current_app_object_is_the_app_behind_the_current_app_proxy() -> None:
    previous = current_app_object()
    app = _app()
    app.set_current()
    try:
        found = current_app_object()
        assert found is app
        assert not isinstance(found, Proxy)
    finally:
        previous.set_current()


def test_current_task_object_is_the_task_behind_the_current_task_proxy() -> None:
    app = _app()

    @app.task(bind=True)
    def which(self: Any) -> bool:
        return current_task_object() is self

    assert which.apply().get() is True
    assert current_task_object() is None


def test_unproxied_reaches_the_task_behind_a_get_current_object_proxy() -> None:
    app = _app()

    @app.task
    def lazy() -> None:
        pass

    assert isinstance(lazy, Proxy)  # defined before the app was finalized
    task = unproxied(lazy)
    assert not isinstance(task, Proxy)
    assert task is app.tasks[task.name]
    assert unproxied(task) is task


def test_signature_app_reads_the_app_a_signature_holds_in_underscore_app() -> None:
    app = _app()

    @app.task
    def bound() -> None:
        pass

    assert signature_app(bound.s()) is app
    assert signature_app(Signature("elsewhere")) is None


# -- settings --------------------------------------------------------------------------------


def test_wrap_settings_censor_replaces_celerys_filter_hidden_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from celery.app import utils

    # A filter not wrapped yet (the ratchet apps of other tests wrapped Celery's own).
    monkeypatch.setattr(utils, "filter_hidden_settings", lambda conf: dict(conf))
    calls: list[int] = []

    def wrap(current: Any) -> Any:
        calls.append(1)
        return lambda conf: {**current(conf), "WRAPPED_SETTING": "seen"}

    wrap_settings_censor(wrap)
    wrap_settings_censor(wrap)
    assert calls == [1]
    app = _app()
    app.conf.some_setting = "x"
    assert "WRAPPED_SETTING" in app.conf.table(censored=True)


# -- the celery program ------------------------------------------------------------------------


def test_offer_pool_adds_to_celery_aliases_and_the_workers_pool_choice() -> None:
    from celery import concurrency
    from celery.bin.worker import WORKERS_POOL
    from celery.concurrency.solo import TaskPool

    alias = "compat-test-pool"
    choices = WORKERS_POOL.choices
    try:
        offer_pool(alias, "celery.concurrency.solo:TaskPool")
        offer_pool(alias, "celery.concurrency.solo:TaskPool")
        assert list(WORKERS_POOL.choices).count(alias) == 1
        app = SimpleNamespace(conf=SimpleNamespace(worker_pool=None))
        ctx = click.Context(click.Command("worker"), obj=SimpleNamespace(app=app))
        assert WORKERS_POOL.convert(alias, None, ctx) is TaskPool
    finally:
        WORKERS_POOL.choices = choices
        concurrency.ALIASES.pop(alias, None)


def test_on_every_cli_app_runs_when_celery_builds_a_cli_context() -> None:
    from celery.bin.base import CLIContext

    seen: list[Any] = []
    remove = on_every_cli_app(seen.append)
    try:
        app = _app()
        CLIContext(app, no_color=True, workdir=None, quiet=True)
        CLIContext(None, no_color=True, workdir=None, quiet=True)
        assert seen == [app]
    finally:
        remove()
    CLIContext(_app(), no_color=True, workdir=None, quiet=True)
    assert len(seen) == 1
