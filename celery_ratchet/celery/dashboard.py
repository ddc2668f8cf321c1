"""``celery_ratchet.metrics_collector(app)``: the Prometheus metrics of a ratchet app's job store,
to register in an application's own registry (docs/metrics.md)."""

from __future__ import annotations

from typing import Any

from celery import Celery

from celery_ratchet.celery.state import ratchet_state


def metrics_collector(app: Celery, **options: Any) -> Any:
    """A prometheus_client collector of ``app``'s job store (the metrics of ``/metrics``), to
    register in an application's own registry: ``REGISTRY.register(metrics_collector(app))``.
    ``options`` are :class:`~celery_ratchet.web.metrics.StoreCollector`'s
    (``window_seconds``, ``sample_limit``, ``buckets``). Needs ``celery-ratchet[metrics]``."""
    from celery_ratchet.web.metrics import StoreCollector

    state = ratchet_state(app)
    options.setdefault("node_grace_seconds", state.settings.node_orphan_grace_seconds)
    return StoreCollector(state.store, **options)
