"""Every Celery app of the process whose task class is a ``RatchetTask`` is a ratchet app
before its first send, result read or control call, however it was made and whatever it does
first: ``celery.Celery("shop", task_cls="celery_ratchet:RatchetTask")`` as much as
``celery_ratchet.Celery("shop")``.

Celery resolves ``task_cls`` only when a task is bound, so on its own the task class cannot
install ratchet in time for a process that first sends by name, reads a result or pings
workers. Instead each app is looked at as its constructor ends (:func:`watch_new_apps`):

- a task class known already (a class, or a string naming a module already imported or one
  of celery_ratchet's) decides at once: a ``RatchetTask`` installs ratchet there, before the
  app's configuration is read, as ``celery_ratchet.Celery`` does;
- a string naming a module not imported yet is left unresolved, as Celery leaves it (the
  module may import the app's own): the app's AMQP, result backend, control and events
  classes stand for themselves until one of them is first instantiated, which is where every
  send (``app.amqp``), result read (``app.backend``) and control call (``app.control``)
  begins. That first instantiation resolves the task class, installs ratchet if it is a
  ``RatchetTask``, and puts Celery's classes back otherwise. A task class that cannot be
  imported then raises ``ConfigurationError`` rather than letting the app use the broker.

This module is imported while kombu is (``celery_ratchet.celery.app.autoload``): it imports
nothing of Celery's app module at import time.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

from celery_ratchet.celery import compat
from celery_ratchet.errors import ConfigurationError

#: The app attributes naming the classes through which sends, result reads, control calls
#: and events begin (Celery instantiates each lazily, once per app).
GATED_CLASSES = ("amqp_cls", "backend_cls", "control_cls", "events_cls")

_DECIDE_LOCK = threading.RLock()


def watch_new_apps() -> None:
    """Look at every Celery app made from now on (and each made already). Idempotent."""
    compat.on_every_new_app(_on_new_app)


def _on_new_app(app: Any) -> None:
    if _installed(app):
        return
    task_cls = _task_class_if_loaded(app.task_cls)
    if task_cls is None:
        _defer(app)
    elif _marks_ratchet_app(task_cls):
        _install(app)


def install_if_ratchet_app(app: Any) -> None:
    """Install ratchet on ``app`` now if its own task class, known already, is a
    ``RatchetTask``; otherwise leave it as it is (an unresolved one is decided at the first
    use). What a bound task's class is says nothing of its app: a shared task (Celery's
    default) declared with a ``RatchetTask`` base is made anew, with that base, on every app
    of the process, a stock Celery app too."""
    if not _installed(app) and _marks_ratchet_app(_task_class_if_loaded(app.task_cls)):
        _install(app)


def _task_class_if_loaded(name: Any) -> Any:
    """The task class ``name`` stands for if resolving it imports nothing of the user's (its
    module is imported already, or is celery_ratchet's own); None otherwise, or when it cannot
    be resolved yet (its module is still being imported)."""
    if not isinstance(name, str):
        return name
    module = name.partition(":")[0] if ":" in name else name.rpartition(".")[0]
    if module not in sys.modules and module.partition(".")[0] != "celery_ratchet":
        return None
    from celery.utils.imports import symbol_by_name

    try:
        return symbol_by_name(name)
    except Exception:
        return None


def _defer(app: Any) -> None:
    for attr in GATED_CLASSES:
        setattr(app, attr, Undecided(app, attr, getattr(app, attr)))


def _decide(app: Any) -> None:
    """Resolve the app's task class; install ratchet if it is a RatchetTask. Puts back the
    classes :func:`_defer` stood in for (those install has not replaced)."""
    with _DECIDE_LOCK:
        if not _installed(app) and _marks_ratchet_app(_task_class(app.task_cls)):
            _install(app)
        for attr in GATED_CLASSES:
            current = getattr(app, attr)
            if isinstance(current, Undecided):
                setattr(app, attr, current.original)


def _task_class(name: Any) -> Any:
    from celery.utils.imports import symbol_by_name

    try:
        return symbol_by_name(name)
    except Exception as exc:
        raise ConfigurationError(
            f"task_cls {name!r} cannot be imported ({type(exc).__name__}), so whether this "
            "app sends to its job store or to its broker is unknown: make the task class "
            "importable, or create the app with celery_ratchet.Celery"
        ) from exc


def _marks_ratchet_app(task_cls: Any) -> bool:
    # By the class's mark, as state.is_ratchet_app reads it (task.py imports this module).
    return isinstance(task_cls, type) and getattr(task_cls, "ratchet_installs_app", False) is True


def _install(app: Any) -> None:
    # Imported here: this module is imported while kombu is, before Celery's app module.
    from celery_ratchet.celery.app.install import install

    install(app)


def _installed(app: Any) -> bool:
    return bool(app.__dict__.get("_ratchet_installed", False))


def _same(value: Any) -> Any:
    return value


class Undecided:
    """Stands for one of an app's classes (``amqp_cls``, ...) while the app's task class is
    unresolved: Celery instantiating it first decides the app, then makes the instance from
    the class the app has then (ratchet's, or Celery's own put back)."""

    def __init__(self, app: Any, attr: str, original: Any) -> None:
        self._app = weakref.ref(app)
        self.attr = attr
        self.original = original

    def __call__(self, *args: Any, app: Any = None, **kwargs: Any) -> Any:
        from celery.utils.imports import symbol_by_name

        owner = app if app is not None else self._app()
        _decide(owner)
        if self.attr == "backend_cls":
            # Celery's result-backend lookup had this object for the backend: look it up
            # again now that the app has its own backend setting back.
            return compat.build_backend(owner)
        return symbol_by_name(getattr(owner, self.attr))(*args, app=owner, **kwargs)

    def __bool__(self) -> bool:
        return True

    def __contains__(self, item: object) -> bool:
        # Celery before 5.7 asks whether the backend setting holds '://' before it looks
        # the backend up (backends.by_url): not a URL, so it is taken as the class itself.
        return False

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        # A pickled app carries Celery's own class here; unpickled, it is looked at anew.
        return (_same, (self.original,))

    def __repr__(self) -> str:
        return f"<undecided {self.attr} {self.original!r}>"
