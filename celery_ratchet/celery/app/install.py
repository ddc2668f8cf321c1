"""Turning a Celery app into a ratchet app: its sender, control, events, consumer step,
settings and worker signals. The composition root of this layer."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from celery import Celery, signals

from celery_ratchet.celery.canvas import batches, workflows
from celery_ratchet.celery.compat import SettingsFilter, forget_cached_backend, wrap_settings_censor
from celery_ratchet.celery.control import flower
from celery_ratchet.celery.schedules import beat_guard, housekeeping
from celery_ratchet.celery.send import lazy_groups
from celery_ratchet.celery.send.message import check_protocol, check_result_backend, safe_accept
from celery_ratchet.celery.send.sender import follow_held_keys
from celery_ratchet.celery.state import (
    INSTALL_LOCK,
    NO_BROKER,
    is_installed,
    is_ratchet_app,
    ratchet_state,
)
from celery_ratchet.celery.worker import pool_choice, retry
from celery_ratchet.celery.worker.consumer import JobConsumer
from celery_ratchet.store.redact import mask_url


def install(app: Celery) -> Celery:
    """Make ``app`` send to and run from its job store. Idempotent; ``task_cls`` does this."""
    with INSTALL_LOCK:
        if is_installed(app):
            return app
        app._ratchet_installed = True
        ratchet_state(app)
        app.amqp_cls = "celery_ratchet.celery.send.amqp:RatchetAMQP"
        app.__dict__.pop("amqp", None)
        app.control_cls = "celery_ratchet.celery.control.control:RatchetControl"
        app.__dict__.pop("control", None)
        app.events_cls = "celery_ratchet.celery.control.events:RatchetEvents"
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
        lazy_groups.connect()
        pool_choice.connect()
        beat_guard.connect()
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
    wrap_settings_censor(_masking_ratchet_urls)


def _masking_ratchet_urls(current: SettingsFilter) -> SettingsFilter:
    def filter_hidden_settings(conf: Mapping[str, Any]) -> dict[str, Any]:
        filtered = current(conf)
        return {
            key: mask_url(value)
            if isinstance(key, str) and isinstance(value, str) and _RATCHET_URL_SETTING.match(key)
            else value
            for key, value in filtered.items()
        }

    return filter_hidden_settings


def _on_configured(sender: Celery, **_: Any) -> None:
    apply_defaults(sender)


def apply_defaults(app: Celery) -> None:
    """Settings every ratchet app needs: results in the store, no broker. The settings it
    refuses raise after the broker is gone: run from Celery's configure signal, whose errors
    Celery only logs, the refusal is raised again by the first send."""
    conf = app.conf
    if not conf.result_backend:
        conf.result_backend = "ratchet://"
        forget_cached_backend(app)
    if "result_backend_always_retry" not in conf.changes:
        # A result written while the database is briefly away waits for it (Celery's own
        # retry, StoreUnavailable being safe to retry) instead of failing a job that ran.
        conf.result_backend_always_retry = True
    forget_broker(app)
    check_result_backend(conf.result_backend)
    check_protocol(conf.task_protocol)


def forget_broker(app: Celery) -> None:
    conf = app.conf
    conf.broker_url = NO_BROKER
    # The in-memory transport, with a main-loop wait that a stop signal ends at once.
    conf.broker_transport = "celery_ratchet.celery.worker.transport:Transport"
    conf.broker_read_url = None
    conf.broker_write_url = None
    # Remote control travels over the broker; ratchet workers are managed through the store.
    conf.worker_enable_remote_control = False


def _connect_worker_signals() -> None:
    # Once per process: the signal keeps one receiver per dispatch_uid.
    signals.celeryd_init.connect(
        _on_worker_init, weak=False, dispatch_uid="celery_ratchet.worker_init"
    )


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
