"""Turning a Celery app into a ratchet app, and the per-app ratchet state."""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from typing import Any

from celery import Celery, signals
from celery.app import utils as celery_app_utils
from celery.utils.imports import symbol_by_name

from celery_ratchet.errors import ConfigurationError
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.engine import EngineOptions
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.redact import mask_url

logger = logging.getLogger(__name__)

_STATE_ATTR = "_ratchet_state"
_INSTALL_LOCK = threading.RLock()
#: Broker URL of every ratchet app: an in-process transport, so nothing is ever contacted.
NO_BROKER = "memory://localhost//"


class RatchetState:
    """What one Celery app needs to talk to its job store."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._settings: RatchetSettings | None = None
        self._store: JobStore | None = None
        self._store_pid = 0
        self._lock = threading.Lock()
        #: The running worker's runtime, in the worker's main process only.
        self.runtime: Any = None
        self._publisher: Any = None
        self._event_sender: Any = None
        #: Serializers of accept_content a worker refused (``ratchet_allow_pickle`` off).
        self.refused_serializers: list[str] | None = None

    @property
    def settings(self) -> RatchetSettings:
        if self._settings is None:
            self._settings = RatchetSettings.from_sources(self.app.conf, os.environ)
        return self._settings

    @property
    def store(self) -> JobStore:
        """The job store of this app in this process (re-created after a fork)."""
        with self._lock:
            if self._store is None or self._store_pid != os.getpid():
                settings = self.settings
                self._store = JobStore(
                    settings.url,
                    create_schema=settings.create_schema,
                    priority_boost_minutes=settings.priority_boost_interval_minutes,
                    notify=settings.wakeups_by_notify,
                    engine_options=engine_options(settings),
                    dlq_alert_task=settings.dlq_alert_task,
                )
                self._store_pid = os.getpid()
            return self._store

    @property
    def batches(self) -> BatchStore:
        """Batches, chain steps and workflow conditions in this app's job store."""
        store = self.store
        batches: BatchStore | None = getattr(store, "_batches", None)
        if batches is None:
            batches = store._batches = BatchStore(store)  # type: ignore[attr-defined]
        return batches

    def reset(self) -> None:
        """Forget cached settings and store, e.g. after the configuration changed."""
        with self._lock:
            self._settings = None
            self._store = None
            self._publisher = None
            self._event_sender = None

    def published(self, queues: list[str]) -> None:
        """Jobs of ``queues`` were committed: wake workers through Redis, if configured."""
        url = self.settings.events_url
        if not url:
            return
        if self._publisher is None:
            from celery_ratchet.events.redis import RedisPublisher

            self._publisher = RedisPublisher(url)
        self._publisher.publish(queues)

    def event_sender(self) -> Any:
        """The client's event dispatcher (``task-sent``), on the events Redis."""
        with self._lock:
            if self._event_sender is None:
                self._event_sender = self.app.events.Dispatcher(enabled=True)
            return self._event_sender

    def wakeup_sources(self) -> list[Any]:
        """The worker's wake-up listeners for this app's settings and database."""
        settings, store = self.settings, self.store
        sources: list[Any] = []
        if store.notify:
            from celery_ratchet.events.postgres import PostgresWakeups
            from celery_ratchet.store.engine import libpq_conninfo

            listen_url = settings.listen_url or store.url
            sources.append(
                PostgresWakeups(
                    libpq_conninfo(listen_url, engine_options(settings)),
                    probe=store.send_probe,
                    on_silent=store.stop_notifying,
                )
            )
        elif settings.listen_notify and settings.pgbouncer and store.family == "postgresql":
            logger.info(
                "ratchet: no LISTEN/NOTIFY wake-ups through PgBouncer (ratchet_pgbouncer): "
                "workers find jobs by polling; set ratchet_listen_url to a direct PostgreSQL "
                "URL for wake-ups"
            )
        if settings.events_url:
            from celery_ratchet.events.redis import RedisWakeups

            sources.append(RedisWakeups(settings.events_url))
        return sources


def engine_options(settings: RatchetSettings) -> EngineOptions:
    return EngineOptions(
        pool_size=settings.pool_size,
        max_overflow=settings.max_overflow,
        pgbouncer=settings.pgbouncer,
        connect_args=settings.connect_args,
    )


def ratchet_state(app: Celery) -> RatchetState:
    state = app.__dict__.get(_STATE_ATTR)
    if state is None:
        with _INSTALL_LOCK:
            state = app.__dict__.get(_STATE_ATTR)
            if state is None:
                state = RatchetState(app)
                setattr(app, _STATE_ATTR, state)
    return state


def is_ratchet_app(app: Celery) -> bool:
    if _STATE_ATTR in app.__dict__:
        return True
    from celery_ratchet.celery.task import RatchetTask

    try:
        task_cls = symbol_by_name(app.task_cls)
    except Exception:
        return False
    return isinstance(task_cls, type) and issubclass(task_cls, RatchetTask)


def install(app: Celery) -> Celery:
    """Make ``app`` send to and run from its job store. Idempotent; ``task_cls`` does this."""
    from celery_ratchet.celery import batches, flower, housekeeping, retry, workflows
    from celery_ratchet.celery.consumer import JobConsumer
    from celery_ratchet.celery.sender import follow_held_keys

    with _INSTALL_LOCK:
        if getattr(app, "_ratchet_installed", False):
            return app
        app._ratchet_installed = True
        ratchet_state(app)
        app.amqp_cls = "celery_ratchet.celery.sender:RatchetAMQP"
        app.__dict__.pop("amqp", None)
        app.control_cls = "celery_ratchet.celery.control:RatchetControl"
        app.__dict__.pop("control", None)
        app.events_cls = "celery_ratchet.celery.events:RatchetEvents"
        app.__dict__.pop("events", None)
        app.steps["consumer"].add(JobConsumer)
        follow_held_keys(app)
        censor_ratchet_urls()
        retry.connect(app)
        housekeeping.register_tasks(app)
        batches.register_tasks(app)
        workflows.register_tasks(app)
        _connect_worker_signals()
        flower.connect()
        if app.configured:
            apply_defaults(app)
        else:
            app.on_after_configure.connect(_on_configured, weak=False)
    return app


#: Settings shown with their credentials masked by ``celery report`` and every listing of
#: the configuration (``app.conf.humanize()``, ``app.conf.table()``).
_RATCHET_URL_SETTING = re.compile(r"^ratchet_.*url", re.IGNORECASE)


def censor_ratchet_urls() -> None:
    """Teach Celery's censoring of settings (``filter_hidden_settings``, used by
    ``celery report`` and ``app.conf.table()``) the ratchet URL settings: it masks only
    settings named like its own secrets. Installed once per process; idempotent."""
    current = celery_app_utils.filter_hidden_settings
    if getattr(current, "_ratchet", False):
        return

    def filter_hidden_settings(conf: Mapping[str, Any]) -> dict[str, Any]:
        filtered = current(conf)
        return {
            key: mask_url(value)
            if isinstance(key, str) and isinstance(value, str) and _RATCHET_URL_SETTING.match(key)
            else value
            for key, value in filtered.items()
        }

    filter_hidden_settings._ratchet = True  # type: ignore[attr-defined]
    celery_app_utils.filter_hidden_settings = filter_hidden_settings


def _on_configured(sender: Celery, **_: Any) -> None:
    apply_defaults(sender)


def apply_defaults(app: Celery) -> None:
    """Settings every ratchet app needs: results in the store, no broker."""
    conf = app.conf
    backend = conf.result_backend
    if not backend:
        conf.result_backend = "ratchet://"
        app._local.__dict__.pop("backend", None)
    elif isinstance(backend, str) and backend.startswith("rpc"):
        raise ConfigurationError(
            "result_backend 'rpc://' sends results over the broker, and a ratchet app has none; "
            "remove result_backend to store results in the job store (the default)"
        )
    if "result_backend_always_retry" not in conf.changes:
        # A result written while the database is briefly away waits for it (Celery's own
        # retry, StoreUnavailable being safe to retry) instead of failing a job that ran.
        conf.result_backend_always_retry = True
    forget_broker(app)


def forget_broker(app: Celery) -> None:
    conf = app.conf
    conf.broker_url = NO_BROKER
    # The in-memory transport, with a main-loop wait that a stop signal ends at once.
    conf.broker_transport = "celery_ratchet.celery.transport:Transport"
    conf.broker_read_url = None
    conf.broker_write_url = None
    # Remote control travels over the broker; ratchet workers are managed through the store.
    conf.worker_enable_remote_control = False


_signals_connected = False


def _connect_worker_signals() -> None:
    global _signals_connected
    if not _signals_connected:
        _signals_connected = True
        signals.celeryd_init.connect(_on_worker_init, weak=False)


def _on_worker_init(sender: Any = None, instance: Any = None, **_: Any) -> None:
    # Runs before the worker looks at its broker: the user's broker_url may have been set
    # (or set again) after the app was configured.
    app = getattr(instance, "app", None)
    if app is not None and is_ratchet_app(app):
        install(app)
        forget_broker(app)
        narrow_accept_content(app)


def narrow_accept_content(app: Celery) -> None:
    """Take the serializers that can run code out of the worker's accept lists unless
    ``ratchet_allow_pickle`` is on; before the pool starts, so its processes never decode
    them either. The worker warns about what it took out once logging is set up."""
    from celery_ratchet.celery.message import safe_accept

    allow = ratchet_state(app).settings.allow_pickle
    refused: set[str] = set()
    for key in ("accept_content", "result_accept_content"):
        value = app.conf.get(key)
        if value is None:
            continue
        kept, dropped = safe_accept(value, allow)
        if dropped:
            app.conf[key] = sorted(kept)
            refused.update(dropped)
    ratchet_state(app).refused_serializers = sorted(refused)


def dlq(app: Celery) -> Any:
    """The app's dead-letter queue (:class:`celery_ratchet.runtime.dlq.DeadLetterQueue`)."""
    from celery_ratchet.runtime.dlq import DeadLetterQueue

    return DeadLetterQueue(ratchet_state(app).store)
