"""Celery, kombu and billiard internals that celery_ratchet relies on, one name each.

Everything of theirs that is private (an underscore name, a method a subclass here overrides,
an object replaced in place) is reached through this module only. tests/unit/test_compat.py
checks every name against the installed releases, one test per name, so a release that
moves one fails the test named after it.

Importing this module imports nothing of Celery's app module: ``first_use`` uses it while
kombu is being imported by Celery (see ``celery_ratchet.celery.app.autoload``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Mapping
from types import CodeType, FrameType
from typing import TYPE_CHECKING, Any

from celery_ratchet.errors import ConfigurationError

if TYPE_CHECKING:
    from celery import Celery

# -- the app and Celery's proxies ------------------------------------------------------------


def forget_cached_backend(app: Celery) -> None:
    """Drop the result backend ``app.backend`` built already (cached in the thread-local
    ``app._local``, Celery 4+), so that the next use builds it from ``result_backend``."""
    app._local.__dict__.pop("backend", None)


def current_app_object() -> Celery:
    """The app behind Celery's ``current_app`` proxy (``Proxy._get_current_object``)."""
    from celery import current_app

    app: Celery = current_app._get_current_object()
    return app


def current_task_object() -> Any:
    """The task running now, or None: what Celery's ``current_task`` proxy stands for
    (``Proxy._get_current_object``)."""
    from celery import current_task

    return current_task._get_current_object()


def unproxied(obj: Any) -> Any:
    """``obj`` itself, or the object behind it when it is one of Celery's proxies (a task
    decorated before its app is finalized; ``Proxy._get_current_object``)."""
    return obj._get_current_object() if hasattr(obj, "_get_current_object") else obj


def build_backend(app: Celery) -> Any:
    """A new result backend for ``app``, from its ``result_backend`` setting (or its
    ``backend_cls``), as ``app.backend`` makes one (``Celery._get_backend``)."""
    return app._get_backend()


_NEW_APP_CALLBACKS: list[Callable[[Any], None]] = []

#: Celery's app module: imported before any app can be made, and after ``celery._state``
#: (which ``celery.app`` imports first) has been imported whole.
_APP_MODULE = "celery.app.base"


def on_every_new_app(callback: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``callback(app)`` for each Celery app as its constructor ends, and now for each
    app made already. Celery's constructor ends by registering the app with the
    ``_register_app`` its module imported from ``celery._state``: that name is replaced by one
    calling back once the app is registered, at once if Celery's app module is imported, else
    as soon as its import ends (kombu, which loads ``celery_ratchet.celery.app.autoload``, is
    imported while ``celery._state`` still is). Returns what takes the callback out again."""
    if callback not in _NEW_APP_CALLBACKS:
        _NEW_APP_CALLBACKS.append(callback)
        if _APP_MODULE in sys.modules:
            from celery import _state

            _follow_new_apps()
            for app in list(_state._get_active_apps()):
                callback(app)
        elif not any(isinstance(finder, _AfterImport) for finder in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(_APP_MODULE, _follow_new_apps))

    def remove() -> None:
        if callback in _NEW_APP_CALLBACKS:
            _NEW_APP_CALLBACKS.remove(callback)

    return remove


def _follow_new_apps() -> None:
    # Not celery._state._apps, the set it registers apps in: Celery's own test fixtures
    # (celery.contrib.testing.app.setup_default_app) put back a copy of it when they end.
    from celery.app import base

    register = base._register_app
    if getattr(register, _WRAPPED_MARK, False):
        return

    def _register_app(app: Any) -> None:
        register(app)
        for callback in list(_NEW_APP_CALLBACKS):
            callback(app)

    setattr(_register_app, _WRAPPED_MARK, True)
    base._register_app = _register_app


class _AfterImport:
    """A finder (first on ``sys.meta_path``) that finds nothing itself: when ``name`` is
    imported, it has the other finders find it and runs ``action()`` once the module has been
    executed, then leaves ``sys.meta_path``."""

    def __init__(self, name: str, action: Callable[[], None]) -> None:
        self.name = name
        self.action = action

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:  # pragma: no cover - a legacy loader: nothing to follow
            return spec
        action = self.action

        def exec_then_act(module: Any) -> None:
            exec_module(module)
            action()

        # On the loader instance (one per module), so the module keeps its own loader.
        loader.exec_module = exec_then_act
        return spec


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


# -- kombu messages and serializers -------------------------------------------------------------


def serializer_decoders() -> dict[str, Callable[..., Any]] | None:
    """kombu's decoders by content type (``kombu.serialization.registry._decoders``), or
    None when the installed kombu keeps them elsewhere."""
    from kombu.serialization import registry

    decoders = getattr(registry, "_decoders", None)
    return decoders if isinstance(decoders, dict) else None


def serializer_codec(name: str) -> Any:
    """kombu's codec registered as ``name`` (``kombu.serialization.registry._encoders``): its
    content type, encoding and encoder; None when it has none by that name, or the installed
    kombu keeps them elsewhere."""
    from kombu.serialization import registry

    encoders = getattr(registry, "_encoders", None)
    return encoders.get(name) if isinstance(encoders, dict) else None


def set_message_state(message: Any, state: str) -> None:
    """Record a kombu message acknowledged (``"ACK"``), rejected or requeued without telling
    a broker (``Message._state``, which ``acknowledged`` reads)."""
    message._state = state


# -- canvas and tracing ----------------------------------------------------------------------


def is_composite_signature(sig: Any) -> bool:
    """Whether ``sig`` is a group, a chain or a chord rather than one task's signature
    (``celery.canvas._chain`` and ``_chord``: the classes ``a | b`` and ``chord`` make)."""
    from celery.canvas import _chain, _chord, group

    return isinstance(sig, (group, _chain, _chord))


def task_tracer(task: Any) -> Callable[..., Any] | None:
    """The tracer the worker built for ``task`` (``Task.__trace__``), which runs it: None
    until the worker builds one."""
    tracer: Callable[..., Any] | None = getattr(task, "__trace__", None)
    return tracer


def set_task_tracer(task: Any, tracer: Callable[..., Any]) -> None:
    """Make ``tracer`` what runs ``task`` in this worker (``Task.__trace__``)."""
    task.__trace__ = tracer


# -- private methods overridden by subclasses here ---------------------------------------------


def private_method(owner: type, name: str) -> Callable[..., Any]:
    """``owner.<name>``, a private method that a subclass here overrides (its name is one of
    the ``*_METHOD`` constants below); AttributeError, naming it, when the release has none."""
    method: Callable[..., Any] | None = getattr(owner, name, None)
    if not callable(method):
        raise AttributeError(f"{owner.__module__}.{owner.__qualname__} has no method {name!r}")
    return method


#: ``celery.concurrency.base.BasePool._get_info``: what ``pool.info`` (``inspect stats``)
#: returns; ``AsyncPool`` adds its own numbers to it.
BASE_POOL_GET_INFO_METHOD = "_get_info"

#: ``kombu.transport.virtual.Channel._purge``: what ``queue_purge`` (``celery purge``) calls;
#: the worker's in-memory ``Channel`` also deletes the queue's pending jobs.
CHANNEL_PURGE_METHOD = "_purge"

#: ``celery.app.amqp.AMQP._create_task_sender``: builds ``amqp.send_task_message``;
#: ``RatchetAMQP`` builds one that writes the job to the store (its body follows Celery's).
AMQP_CREATE_TASK_SENDER_METHOD = "_create_task_sender"

#: ``kombu.Connection._reraise_as_library_errors``: ``Celery.send_task`` enters it on the
#: producer's connection; the stand-in connection of a ratchet producer has one too.
CONNECTION_RERAISE_METHOD = "_reraise_as_library_errors"

#: The methods of ``celery.backends.base.BaseBackend`` a backend implements to store
#: results, called by its public ones (``store_result``, ``get_task_meta``, ``forget``,
#: ``save_group``, ``restore_group``, ``delete_group``).
BACKEND_STORAGE_METHODS = (
    "_store_result",
    "_get_task_meta_for",
    "_forget",
    "_save_group",
    "_restore_group",
    "_delete_group",
)

#: ``celery.backends.base.BaseBackend._sleep``: the pause between two retries of a result
#: write (``result_backend_always_retry``); ``RatchetBackend`` ends it when the worker stops.
BACKEND_RETRY_SLEEP_METHOD = "_sleep"

#: ``celery.worker.request.Request._announce_revoked``: every revoke of a request Celery
#: acts on (revoked before it ran, terminated, expired) ends in it.
REQUEST_ANNOUNCE_REVOKED_METHOD = "_announce_revoked"


# -- the worker's requests -----------------------------------------------------------------


def request_already_revoked(request: Any) -> bool:
    """Whether Celery announced the request revoked already (``Request._already_revoked``)."""
    return bool(getattr(request, "_already_revoked", False))


def request_already_cancelled(request: Any) -> bool:
    """Whether Celery cancelled the running request, to retry it (``Request.
    _already_cancelled``, set by ``cancel``)."""
    return bool(getattr(request, "_already_cancelled", False))


def request_terminates_on_ack(request: Any) -> bool:
    """Whether a terminate was asked before a pool process took the request, to be carried
    out when one does (``Request._terminate_on_ack``)."""
    return request._terminate_on_ack is not None


# -- sending ---------------------------------------------------------------------------------


def cached_producer_pool(amqp: Any) -> Any:
    """The producer pool ``amqp`` made already, or None (``AMQP._producer_pool``, which
    ``Celery._after_fork`` clears in a forked process)."""
    return amqp.__dict__.get("_producer_pool")


def cache_producer_pool(amqp: Any, pool: Any) -> None:
    """Keep ``pool`` as ``amqp``'s producer pool where Celery keeps its own
    (``AMQP._producer_pool``), so that a forked process makes a new one."""
    amqp._producer_pool = pool


# -- results ---------------------------------------------------------------------------------


def ensure_not_eager(backend: Any) -> None:
    """Celery's warning that an eager task's result is not stored (``BaseBackend.
    _ensure_not_eager``), given before waiting for one."""
    backend._ensure_not_eager()


def is_lazy_generator_result(value: Any) -> bool:
    """Whether ``value`` is Celery's lazily evaluated list (``celery.utils.functional.
    _regen``, what ``regen`` makes of a generator): a chord header of plain tasks."""
    from celery.utils.functional import _regen

    return isinstance(value, _regen)


# -- billiard's pool (``celery worker -P ratchet``) -------------------------------------------


@functools.cache
def _stop_handler_code() -> CodeType | None:
    """The code of the handler Celery's worker installs for its stop signals (SIGTERM,
    SIGINT, SIGQUIT): ``_handle_request``, made by ``celery.apps.worker._shutdown_handler``."""
    from celery.apps import worker

    outer = getattr(worker, "_shutdown_handler", None)
    for const in getattr(getattr(outer, "__code__", None), "co_consts", ()):
        if isinstance(const, CodeType) and const.co_name == "_handle_request":
            return const
    return None


def in_stop_signal_handler() -> bool:
    """Whether this thread is inside the worker's stop signal handler now, which may have
    interrupted it anywhere. By the handler's frame on the stack: Celery's own flag
    (``celery.utils.log.in_sighandler``) stays set for good after a SIGHUP restart."""
    code = _stop_handler_code()
    frame: FrameType | None = sys._getframe(1)
    while code is not None and frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


#: ``billiard.pool.Pool._help_stuff_finish``: the pool's end drains its input queue with it;
#: ``_BlockingPool`` overrides it so that a lock taken by a dead process is not waited for.
POOL_HELP_STUFF_FINISH_METHOD = "_help_stuff_finish"


def billiard_pool_of(task_pool: Any) -> Any:
    """The billiard pool that Celery's prefork pool runs (``TaskPool._pool``), or None
    before it starts."""
    return task_pool._pool


def forget_billiard_pool(task_pool: Any) -> None:
    """Celery's prefork pool has no billiard pool any more (``TaskPool._pool = None``, as its
    own ``on_stop`` leaves it)."""
    task_pool._pool = None


def pool_state(pool: Any) -> int:
    """The billiard pool's state (``Pool._state``): ``billiard.pool.RUN``, ``CLOSE`` or
    ``TERMINATE``."""
    state: int = pool._state
    return state


def pool_processes(pool: Any) -> list[Any]:
    """The billiard pool's processes, a copy of the list (``Pool._pool``)."""
    return list(pool._pool)


def process_started(process: Any) -> bool:
    """Whether a billiard process was started and not joined yet (``Process._popen``)."""
    return process._popen is not None


def pool_unfinished_jobs(pool: Any) -> list[Any]:
    """The jobs the billiard pool was given and has no result for yet (``Pool._cache``)."""
    return [job for job in list(pool._cache.values()) if not job.ready()]


def pool_task_handler_alive(pool: Any) -> bool:
    """Whether the billiard pool's thread that hands jobs to its input queue still runs
    (``Pool._task_handler``)."""
    return bool(pool._task_handler.is_alive())


def pool_input_queue(pool: Any) -> Any:
    """The queue the billiard pool's processes take their jobs from (``Pool._inqueue``)."""
    return pool._inqueue


def take_input_lock(inqueue: Any, timeout: float) -> bool:
    """Take the lock a process holds while it waits for its next job (``SimpleQueue._rlock``),
    giving up after ``timeout`` seconds; it is not released again."""
    return bool(inqueue._rlock.acquire(timeout=timeout))


def input_waiting(inqueue: Any) -> bool:
    """Whether a job waits in the input queue (``SimpleQueue._reader.poll()``)."""
    return bool(inqueue._reader.poll())


def discard_input(inqueue: Any) -> None:
    """Take the next job out of the input queue, unread (``SimpleQueue._reader.recv()``)."""
    inqueue._reader.recv()


def close_pool_at_once(pool: Any) -> None:
    """billiard's ``Pool.close``, without waiting for its supervisor thread to notice (it
    sleeps most of a second between two looks): ``_state``, ``_putlock``,
    ``_worker_handler`` and ``_taskqueue``, as billiard 4 sets them."""
    from billiard import pool as billiard_pool

    if pool._state == billiard_pool.RUN:
        pool._state = billiard_pool.CLOSE
        if pool._putlock:
            pool._putlock.clear()
        pool._worker_handler.close()
        pool._taskqueue.put(None)


def stop_pool_threads(pool: Any) -> None:
    """End a billiard pool whose processes are gone without joining its threads, each asleep
    for up to a second: its finalizer (``_terminate``) is cancelled, its state made
    TERMINATE, and its handler threads (``_worker_handler``, ``_task_handler``,
    ``_result_handler``, ``_timeout_handler``) told to stop."""
    from billiard import pool as billiard_pool

    pool._terminate.cancel()
    pool._state = billiard_pool.TERMINATE
    for thread in (pool._worker_handler, pool._task_handler, pool._result_handler):
        thread.terminate()
    if pool._timeout_handler is not None:
        pool._timeout_handler.terminate()


def exit_as_billiard_does(signum: int, frame: Any) -> None:
    """What a billiard pool process does on a stop signal (``billiard.common.
    _shutdown_cleanup``): exits through its ``finally`` blocks (``sys.exit``)."""
    from billiard.common import _shutdown_cleanup

    _shutdown_cleanup(signum, frame)


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


def wrap_group_apply_async(wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace Celery's ``celery.canvas.group.apply_async`` by ``wrap(original)``, once per
    process: a group has no public seam between its members' sends."""
    from celery.canvas import group

    if not getattr(group.apply_async, "__ratchet_wrapped__", False):
        wrapped = wrap(group.apply_async)
        wrapped.__ratchet_wrapped__ = True  # type: ignore[attr-defined]
        group.apply_async = wrapped


def group_tasks_are_lazy(group: Any) -> bool:
    """Whether a group's members come from a generator that Celery reads as it sends them
    (see :func:`is_lazy_generator_result`: what ``group(<generator>)`` keeps)."""
    return is_lazy_generator_result(getattr(group, "tasks", None))


def continues_chain_of(request: Any, job_id: str, embedded_chain: Any) -> bool:
    """Whether the message of ``job_id``, sent from inside the task of ``request``, is that
    task's chain continuing (its next step), judged by how the tracer sends the step.
    Celery 5.6 and later read the next step off the end of ``request.chain`` and send the
    rest as a copy; 5.5 pops it and sends the very list that is left."""
    chain = getattr(request, "chain", None)
    if not isinstance(chain, list):
        return False
    if chain and isinstance(chain[-1], dict):
        options = chain[-1].get("options") or {}
        if options.get("task_id") == job_id:
            return True
    return embedded_chain is chain


# -- groups sent from one message (celery_ratchet.celery.send.alike_groups) ------------------------


def freeze_group_id(group: Any, options: dict[str, Any]) -> tuple[dict[str, Any], str, Any]:
    """The options a group's members are sent with, its group id and root id, as Celery's
    ``group.apply_async`` fixes them (``group._freeze_gid``)."""
    merged, group_id, root_id = group._freeze_gid(options)
    return merged, group_id, root_id


def argument_reprs(app: Celery, args: Any, kwargs: Any) -> tuple[str, str]:
    """``argsrepr`` and ``kwargsrepr`` as Celery's ``AMQP.as_task_v2`` writes them (5.7 reads
    ``task_repr_maxlevels``; 5.5 has saferepr's own default, the same 3)."""
    from celery.utils.saferepr import saferepr

    amqp = app.amqp
    limits = amqp.argsrepr_maxsize, amqp.kwargsrepr_maxsize
    reprs = _flat_repr(args, limits[0]), _flat_repr(kwargs, limits[1])
    if reprs[0] is not None and reprs[1] is not None:
        return reprs[0], reprs[1]
    levels = app.conf.get("task_repr_maxlevels", 3)
    return (
        reprs[0] if reprs[0] is not None else saferepr(args, limits[0], maxlevels=levels),
        reprs[1] if reprs[1] is not None else saferepr(kwargs, limits[1], maxlevels=levels),
    )


def _flat_repr(value: Any, limit: int | None) -> str | None:
    """What Celery's ``saferepr(value, limit)`` gives, for the arguments most tasks take: a
    tuple, list or dict (string keys) of ints and plain printable ASCII strings, shorter
    than ``limit``; None for anything else (saferepr itself then). saferepr writes such a
    value as repr() does, but for strings, which it quotes with single quotes always."""
    kind = type(value)
    if kind is dict:
        parts = []
        for key, item in value.items():
            shown_key, shown = _scalar_repr(key), _scalar_repr(item)
            if shown_key is None or shown is None or type(key) is not str:
                return None
            parts.append(f"{shown_key}: {shown}")
        text = "{" + ", ".join(parts) + "}"
    elif kind is tuple or kind is list:
        parts = []
        for item in value:
            shown = _scalar_repr(item)
            if shown is None:
                return None
            parts.append(shown)
        inner = ", ".join(parts)
        closing = ",)" if kind is tuple and len(parts) == 1 else ")"
        text = f"[{inner}]" if kind is list else f"({inner}{closing}"
    else:
        return None
    return text if limit is None or len(text) < limit else None


def _scalar_repr(value: Any) -> str | None:
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is str and value.isascii() and value.isprintable() and "'" not in value:
        return "'" + value + "'" if "\\" not in value else None
    return None


def sends_as_celery(app: Celery, task: Any) -> bool:
    """Whether a send of ``task`` is Celery's own from end to end, so that one member's
    message can stand for another's: the task's ``apply_async`` and ``shadow_name`` (of its
    class, none set on the task itself), the app's ``send_task`` (ratchet's, around
    Celery's), its ``create_task_message`` (``as_task_v2``: protocol 2), no router (one
    may route by arguments), no pydantic argument dumping, and the app's
    ``send_task_message`` that writes rows."""
    from celery.app.task import Task

    task_py, base_py, amqp_py = (
        ("celery", "app", "task.py"),
        ("celery", "app", "base.py"),
        ("celery", "app", "amqp.py"),
    )
    if not issubclass(type(task), Task) or getattr(task, "__v2_compat__", False):
        return False
    if getattr(task, "_dump_pydantic_arguments", None) is not None:
        return False
    if {"apply_async", "shadow_name"} & vars(task).keys():
        return False
    if not (
        _is_celerys(type(task).apply_async, task_py)
        and _is_celerys(type(task).shadow_name, task_py)
    ):
        return False
    ours, wrapped = getattr(app, "ratchet_send_task", (None, None))
    if app.send_task is not ours or not _is_celerys(getattr(wrapped, "__func__", None), base_py):
        return False
    amqp = app.amqp
    if amqp.send_task_message is not getattr(amqp, "ratchet_sender", None):
        return False
    create = amqp.create_task_message
    if getattr(create, "__name__", None) != "as_task_v2" or not _is_celerys(
        getattr(create, "__func__", None), amqp_py
    ):
        return False
    return app.conf.task_protocol == 2 and not getattr(amqp.router, "routes", None)


def _is_celerys(function: Any, where: tuple[str, ...]) -> bool:
    """``function`` is Celery's own, as its source defines it (not a wrapper of it)."""
    import os

    code = getattr(function, "__code__", None)
    if code is None or getattr(function, "__wrapped__", None) is not None:
        return False
    return bool(code.co_filename.endswith(os.path.join(*where)))
