"""One test per Celery internal named in celery_ratchet.celery.compat."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from celery_ratchet.celery.compat import DJANGO_TASK_METHODS, django_task_method
from celery_ratchet.errors import ConfigurationError


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


def test_group_tasks_are_lazy_tells_a_group_of_a_generator_from_one_of_a_list() -> None:
    from celery import Celery, group

    from celery_ratchet.celery.compat import group_tasks_are_lazy

    app = Celery(set_as_current=False)

    @app.task(name="t.noop", shared=False)
    def noop() -> None:
        pass

    assert group_tasks_are_lazy(group(noop.s() for _ in range(2)))
    assert not group_tasks_are_lazy(group([noop.s(), noop.s()]))


def test_wrap_group_apply_async_wraps_celerys_group_once() -> None:
    from celery.canvas import group

    from celery_ratchet.celery import lazy_groups

    lazy_groups.connect()
    lazy_groups.connect()
    wrapped = group.apply_async
    assert getattr(wrapped, "__ratchet_wrapped__", False)
    original = wrapped.__wrapped__  # type: ignore[attr-defined]
    assert not getattr(original, "__ratchet_wrapped__", False)
    assert original.__qualname__ == "group.apply_async"
