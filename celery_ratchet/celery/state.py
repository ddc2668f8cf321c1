"""The per-app ratchet state: settings, the job store and the wake-up sources of one app.

Every module of this layer reaches its app's store through :func:`ratchet_state`, as the
store's ports (:class:`~celery_ratchet.store.celery_ports.CeleryStore`); the state is where
the :class:`~celery_ratchet.store.jobstore.JobStore` is made, and it knows nothing of how an
app is installed (:mod:`celery_ratchet.celery.app.install`)."""

from __future__ import annotations

import logging
import os
import threading
from datetime import datetime
from typing import Any

from celery import Celery
from celery.utils.imports import symbol_by_name

from celery_ratchet.celery.django.django_store import explicit_url, with_django_defaults
from celery_ratchet.runtime.node_clock import NodeClock
from celery_ratchet.settings import DEFAULT_URL, RatchetSettings
from celery_ratchet.store.celery_ports import Batches, CeleryStore
from celery_ratchet.store.engine import EngineOptions
from celery_ratchet.store.jobstore import JobStore

logger = logging.getLogger(__name__)

_STATE_ATTR = "_ratchet_state"
#: Guards the making of an app's state and its installation (re-entrant: install makes state).
INSTALL_LOCK = threading.RLock()
#: Broker URL of every ratchet app: an in-process transport, so nothing is ever contacted.
NO_BROKER = "memory://localhost//"
_default_store_told = threading.Event()


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
        self._clock: NodeClock | None = None

    @property
    def settings(self) -> RatchetSettings:
        if self._settings is None:
            # In a Django project with celery_ratchet.contrib.django: Django's database.
            conf = with_django_defaults(self.app.conf)
            settings = RatchetSettings.from_sources(conf, os.environ)
            if settings.url == DEFAULT_URL and explicit_url(conf) is None:
                _tell_default_store()
            self._settings = settings
        return self._settings

    @property
    def store(self) -> CeleryStore:
        """The job store of this app in this process (re-created after a fork), as what the
        Celery layer asks of it."""
        return self.job_store

    @property
    def job_store(self) -> JobStore:
        """The same store as the class that implements it: for the assembly (celery/app/:
        the CLI it serves takes a JobStore) and this module's wake-up sources."""
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
    def clock(self) -> NodeClock:
        """This process's clock, corrected to the job store's database's: relative delays
        (countdowns, retries, schedules) are reckoned on it."""
        clock = self._clock
        if clock is None:
            with self._lock:
                if self._clock is None:
                    self._clock = NodeClock(
                        _StoreOfThisProcess(self), self.settings.clock_skew_warning_seconds
                    )
                clock = self._clock
        return clock

    @property
    def batches(self) -> Batches:
        """Batches, chain steps and workflow conditions in this app's job store."""
        return self.store.batches

    def reset(self) -> None:
        """Forget cached settings and store, e.g. after the configuration changed."""
        with self._lock:
            self._settings = None
            self._store = None
            self._publisher = None
            self._event_sender = None
            self._clock = None

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
        settings, store = self.settings, self.job_store
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
        elif settings.listen_notify and settings.pgbouncer and store.dialect.notifies:
            logger.info(
                "ratchet: no LISTEN/NOTIFY wake-ups through PgBouncer (ratchet_pgbouncer): "
                "workers find jobs by polling; set ratchet_listen_url to a direct PostgreSQL "
                "URL for wake-ups"
            )
        if settings.events_url:
            from celery_ratchet.events.redis import RedisWakeups

            sources.append(RedisWakeups(settings.events_url))
        return sources


def _tell_default_store() -> None:
    """Once in a process: no store URL is set, so jobs go to a file of the working directory,
    where the fleet's workers may not look (a configuration that did not load)."""
    if _default_store_told.is_set():
        return
    _default_store_told.set()
    logger.warning(
        "ratchet: job store: %s, the default (a file in %s): set ratchet_url (or RATCHET_URL) "
        "to your job store's database",
        DEFAULT_URL,
        os.getcwd(),
    )


def engine_options(settings: RatchetSettings) -> EngineOptions:
    return EngineOptions(
        pool_size=settings.pool_size,
        max_overflow=settings.max_overflow,
        pgbouncer=settings.pgbouncer,
        connect_args=settings.connect_args,
        statement_deadline_seconds=settings.statement_deadline,
        liveness_deadline_seconds=settings.liveness_deadline,
        tcp_timeout_seconds=settings.liveness_margin,
    )


def has_state(app: Celery) -> bool:
    """Whether ``app`` has been given ratchet state (it has been installed or asked for it)."""
    return _STATE_ATTR in app.__dict__


def is_installed(app: Celery) -> bool:
    """Whether ratchet is installed on ``app`` (its sends go to the store)."""
    return bool(app.__dict__.get("_ratchet_installed", False))


def is_ratchet_app(app: Celery) -> bool:
    if has_state(app):
        return True
    try:
        task_cls = symbol_by_name(app.task_cls)
    except Exception:
        return False
    # By the class's mark, not issubclass: the task class installs its app, so this module
    # cannot import it.
    return isinstance(task_cls, type) and getattr(task_cls, "ratchet_installs_app", False) is True


def ratchet_state(app: Celery) -> RatchetState:
    state = app.__dict__.get(_STATE_ATTR)
    if state is None:
        with INSTALL_LOCK:
            state = app.__dict__.get(_STATE_ATTR)
            if state is None:
                state = RatchetState(app)
                setattr(app, _STATE_ATTR, state)
    return state


def dlq(app: Celery) -> Any:
    """The app's dead-letter queue (:class:`celery_ratchet.runtime.dlq.DeadLetterQueue`)."""
    from celery_ratchet.runtime.dlq import DeadLetterQueue

    return DeadLetterQueue(ratchet_state(app).store)


class _StoreOfThisProcess:
    """The state's store as it is when asked (re-created after a fork)."""

    def __init__(self, state: RatchetState) -> None:
        self._state = state

    def database_time(self) -> datetime | None:
        return self._state.store.database_time()
