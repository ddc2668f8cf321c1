"""``celery_ratchet.dashboard(app)``: the dashboard of a ratchet app's job store, as a WSGI
application to mount in a web application of one's own (docs/how-to/dashboard.md);
``celery_ratchet.metrics_collector(app)``: its Prometheus metrics alone (docs/metrics.md)."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.web.app import Dashboard


def dashboard(app: Celery, **options: Any) -> Dashboard:
    """The dashboard (its pages, actions and ``/metrics``) on ``app``'s job store and its
    connections. ``options`` are :class:`~celery_ratchet.web.app.Dashboard`'s: ``secret``
    (the application's own secret key, so that every process of it accepts the forms of the
    others), ``hosts``, ``read_only``, ``auth``. A node is counted alive by ``/metrics`` as
    long as the app's ``ratchet_node_orphan_grace_seconds`` says."""
    state = ratchet_state(app)
    options.setdefault("node_grace_seconds", state.settings.node_orphan_grace_seconds)
    return Dashboard(state.store, **options)


def metrics_collector(app: Celery, **options: Any) -> Any:
    """A prometheus_client collector of ``app``'s job store (the metrics of ``/metrics``), to
    register in an application's own registry: ``REGISTRY.register(metrics_collector(app))``.
    ``options`` are :class:`~celery_ratchet.web.metrics.StoreCollector`'s
    (``window_seconds``, ``sample_limit``, ``buckets``). Needs ``celery-ratchet[metrics]``."""
    from celery_ratchet.web.metrics import StoreCollector

    state = ratchet_state(app)
    options.setdefault("node_grace_seconds", state.settings.node_orphan_grace_seconds)
    return StoreCollector(state.store, **options)
