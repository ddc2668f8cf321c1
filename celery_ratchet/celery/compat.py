"""Celery, kombu and billiard internals that celery_ratchet relies on, one name each.

Everything of theirs that is private (an underscore name, a method a subclass here overrides,
an object replaced in place) is reached through this module only. tests/unit/test_compat.py
checks every name against the installed releases, one test per name, so a release that
moves one fails the test named after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery, current_app, current_task

from celery_ratchet.errors import ConfigurationError

# -- the app and Celery's proxies ------------------------------------------------------------


def forget_cached_backend(app: Celery) -> None:
    """Drop the result backend ``app.backend`` built already (cached in the thread-local
    ``app._local``, Celery 4+), so that the next use builds it from ``result_backend``."""
    app._local.__dict__.pop("backend", None)


def current_app_object() -> Celery:
    """The app behind Celery's ``current_app`` proxy (``Proxy._get_current_object``)."""
    app: Celery = current_app._get_current_object()
    return app


def current_task_object() -> Any:
    """The task running now, or None: what Celery's ``current_task`` proxy stands for
    (``Proxy._get_current_object``)."""
    return current_task._get_current_object()


def unproxied(obj: Any) -> Any:
    """``obj`` itself, or the object behind it when it is one of Celery's proxies (a task
    decorated before its app is finalized; ``Proxy._get_current_object``)."""
    return obj._get_current_object() if hasattr(obj, "_get_current_object") else obj


def signature_app(sig: Any) -> Celery | None:
    """The app a signature was made with, or None (``Signature._app``; its ``app`` property
    falls back to ``current_app``)."""
    app: Celery | None = sig._app
    return app


# -- settings --------------------------------------------------------------------------------

SettingsFilter = Callable[[Mapping[str, Any]], dict[str, Any]]
_WRAPPED_MARK = "_ratchet"


def wrap_settings_censor(wrap: Callable[[SettingsFilter], SettingsFilter]) -> None:
    """Replace ``celery.app.utils.filter_hidden_settings`` (which ``app.conf.table()`` and
    ``celery report`` look up in its module at each call) with ``wrap(current)``. Once per
    process: a second call changes nothing."""
    from celery.app import utils

    current = utils.filter_hidden_settings
    if getattr(current, _WRAPPED_MARK, False):
        return
    wrapped = wrap(current)
    setattr(wrapped, _WRAPPED_MARK, True)
    utils.filter_hidden_settings = wrapped


# -- the celery program ------------------------------------------------------------------------


def offer_pool(alias: str, path: str) -> None:
    """Make ``alias`` a pool: one Celery resolves (``celery.concurrency.ALIASES``) and one
    ``celery worker --pool`` accepts (the choices of ``celery.bin.worker.WORKERS_POOL``,
    fixed when Celery's CLI is imported)."""
    from celery import concurrency

    concurrency.ALIASES.setdefault(alias, path)
    try:
        from celery.bin.worker import WORKERS_POOL
    except ImportError:  # pragma: no cover - Celery without its CLI
        return
    if alias not in WORKERS_POOL.choices:
        WORKERS_POOL.choices = (*WORKERS_POOL.choices, alias)


_CLI_APP_CALLBACKS: list[Callable[[Any], None]] = []
_CLI_WRAPPED_MARK = "_ratchet_wrapped"


def on_every_cli_app(callback: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``callback(app)`` whenever a ``celery`` subcommand builds its context (wraps
    ``celery.bin.base.CLIContext.__init__``), before the command runs; an app of None is not
    passed on. Returns what takes the callback out again."""
    try:
        from celery.bin.base import CLIContext
    except ImportError:  # pragma: no cover - Celery without its CLI
        return lambda: None
    if callback not in _CLI_APP_CALLBACKS:
        _CLI_APP_CALLBACKS.append(callback)
    if not getattr(CLIContext, _CLI_WRAPPED_MARK, False):
        original = CLIContext.__init__

        def __init__(self: Any, app: Any, *args: Any, **kwargs: Any) -> None:
            original(self, app, *args, **kwargs)
            if app is not None:
                for each in list(_CLI_APP_CALLBACKS):
                    each(app)

        CLIContext.__init__ = __init__
        setattr(CLIContext, _CLI_WRAPPED_MARK, True)

    def remove() -> None:
        if callback in _CLI_APP_CALLBACKS:
            _CLI_APP_CALLBACKS.remove(callback)

    return remove


# -- task classes ------------------------------------------------------------------------------

#: The methods Celery's Django task class adds (``celery.contrib.django.task.DjangoTask``),
#: which Celery gives an app only when it sets no task class of its own.
DJANGO_TASK_METHODS = ("delay_on_commit", "apply_async_on_commit")


def django_task_method(name: str) -> Callable[..., Any]:
    """Celery's own ``DjangoTask.<name>``, to call with any task as ``self``."""
    if name not in DJANGO_TASK_METHODS:
        raise ValueError(f"{name!r} is not one of Celery's Django task methods")
    try:
        from celery.contrib.django.task import DjangoTask
    except ImportError:
        raise ConfigurationError(
            f"task.{name}() runs the send when the current Django transaction commits, and "
            "Django is not installed: install Django, or call delay()/apply_async()"
        ) from None
    method: Callable[..., Any] = getattr(DjangoTask, name)
    return method


def message_ignore_result_overrides_task() -> bool:
    """Whether the message's ``ignore_result`` (when the sender set it) overrides the task's own.

    Celery 5.6+ decides by the message when it carries the flag (``get_actual_ignore_result``);
    older releases always send it (False by default) and ignore a result when either the
    message or the task says so."""
    from celery.app import task

    return hasattr(task, "get_actual_ignore_result")
