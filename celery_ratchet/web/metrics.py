"""``GET /metrics``: the job store's state in Prometheus' exposition formats, made by
prometheus_client (``pip install celery-ratchet[metrics]``) from one reading of the store per
scrape (its ``metrics_reads``: :mod:`celery_ratchet.store.metrics_reads`). docs/metrics.md
describes each metric.

:class:`StoreCollector` is a prometheus_client collector: register it in an application's own
registry to export these beside its other metrics, without the dashboard::

    from prometheus_client import REGISTRY
    REGISTRY.register(StoreCollector(store))
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeHistogramMetricFamily, GaugeMetricFamily, Metric

from celery_ratchet.store.read_ports import DashboardStore, Durations, MetricsSnapshot

#: Upper bounds (seconds) of the wait and run time histograms' buckets.
BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
    600.0, 1800.0, 3600.0,
)  # fmt: skip
#: Seconds of finished jobs the ``ratchet_recent_*`` metrics look back over.
WINDOW_SECONDS = 300.0
#: The newest finished jobs of the window whose wait and run times are read, at most.
SAMPLE_LIMIT = 2_000
#: A node whose heartbeat is older is not counted alive (``ratchet_node_orphan_grace_seconds``).
NODE_GRACE_SECONDS = 60.0


class StoreCollector:
    """Reads the store at each collection (each scrape): a few statements on one connection,
    none of which reads the history of finished jobs (see docs/metrics.md)."""

    def __init__(
        self,
        store: DashboardStore,
        *,
        window_seconds: float = WINDOW_SECONDS,
        sample_limit: int = SAMPLE_LIMIT,
        node_grace_seconds: float = NODE_GRACE_SECONDS,
        buckets: Sequence[float] = BUCKETS,
    ) -> None:
        self.reads = store.metrics_reads
        self.window_seconds = window_seconds
        self.sample_limit = sample_limit
        self.node_grace_seconds = node_grace_seconds
        self.buckets = tuple(sorted(buckets))

    def describe(self) -> Iterable[Metric]:
        """Nothing: registering the collector must not read the store."""
        return ()

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        reading = self.reads.read(
            window_seconds=self.window_seconds, limit=self.sample_limit, bounds=self.buckets
        )
        took = time.perf_counter() - started
        yield from self._jobs(reading)
        yield from self._nodes(reading)
        yield from self._resources(reading)
        yield from self._schedules(reading)
        yield from self._recent(reading)
        yield _gauge(
            "ratchet_metrics_read_seconds",
            "Seconds this scrape took to read the job store.",
            [],
            [((), took)],
        )

    def _jobs(self, reading: MetricsSnapshot) -> Iterator[Metric]:
        yield _gauge(
            "ratchet_jobs",
            "Jobs not finished, per queue and status (PENDING, WAITING, RUNNING).",
            ["queue", "status"],
            reading.jobs.items(),
        )
        yield _gauge(
            "ratchet_queue_due_jobs",
            "Pending jobs whose due time has passed, per queue.",
            ["queue"],
            (((q,), n) for q, n in reading.due.items()),
        )
        ages = {q: reading.oldest_due_age.get(q, 0.0) for q in reading.due}
        yield _gauge(
            "ratchet_queue_oldest_due_age_seconds",
            "Seconds the oldest due pending job of each queue has waited (0: none due).",
            ["queue"],
            (((q,), age) for q, age in ages.items()),
        )
        yield _gauge(
            "ratchet_dead_letters",
            "Failed jobs kept (the dead-letter queue), per queue.",
            ["queue"],
            (((q,), n) for q, n in reading.dead_letters.items()),
        )
        yield _gauge(
            "ratchet_queue_paused_seconds",
            "Seconds since each paused queue was paused (ratchet queues pause); absent: running.",
            ["queue"],
            (((q,), age) for q, age in reading.paused.items()),
        )

    def _nodes(self, reading: MetricsSnapshot) -> Iterator[Metric]:
        alive = [n for n in reading.nodes if n.heartbeat_age <= self.node_grace_seconds]
        yield _gauge(
            "ratchet_nodes_alive",
            "Worker nodes whose heartbeat is younger than the orphan grace period.",
            [],
            [((), len(alive))],
        )
        nodes = [(n.node_id, n.hostname) for n in reading.nodes]
        yield _gauge(
            "ratchet_node_up",
            "1 while a registered node's heartbeat is younger than the grace period, else 0.",
            ["node", "hostname"],
            ((key, 1 if n in alive else 0) for key, n in zip(nodes, reading.nodes, strict=True)),
        )
        yield _gauge(
            "ratchet_node_heartbeat_age_seconds",
            "Seconds since each registered node's last heartbeat, by the database clock.",
            ["node"],
            (((n.node_id,), n.heartbeat_age) for n in reading.nodes),
        )
        yield _gauge(
            "ratchet_node_concurrency",
            "How many jobs each registered node runs at once.",
            ["node"],
            (((n.node_id,), n.concurrency) for n in reading.nodes),
        )
        running = {n.node_id: 0 for n in reading.nodes} | reading.running_by_node
        yield _gauge(
            "ratchet_node_running_jobs",
            "Jobs RUNNING under each node (a node no longer registered included).",
            ["node"],
            (((node,), n) for node, n in running.items()),
        )

    def _resources(self, reading: MetricsSnapshot) -> Iterator[Metric]:
        yield _gauge(
            "ratchet_resource_capacity",
            "Permits of each resource, as the last node that claimed for it declared.",
            ["resource"],
            (((r,), cap) for r, (cap, _) in reading.resources.items() if cap is not None),
        )
        yield _gauge(
            "ratchet_resource_permits_in_use",
            "Permits of each resource held by running jobs.",
            ["resource"],
            (((r,), held) for r, (_, held) in reading.resources.items()),
        )

    def _schedules(self, reading: MetricsSnapshot) -> Iterator[Metric]:
        yield _gauge(
            "ratchet_schedules",
            "Recurring schedules, active or paused.",
            ["state"],
            (((state,), n) for state, n in reading.schedules.items()),
        )
        yield _gauge(
            "ratchet_schedules_late",
            "Active schedules whose fire time has passed and that no worker has fired yet.",
            [],
            [((), reading.schedules_late)],
        )
        yield _gauge(
            "ratchet_schedule_lateness_seconds",
            "Seconds since the fire time of each late schedule (the 50 most late).",
            ["schedule"],
            (((key,), late) for key, late in reading.late_schedules.items()),
        )

    def _recent(self, reading: MetricsSnapshot) -> Iterator[Metric]:
        yield _gauge(
            "ratchet_recent_window_seconds",
            "Seconds of finished jobs the ratchet_recent_* metrics look back over.",
            [],
            [((), self.window_seconds)],
        )
        yield _gauge(
            "ratchet_recent_jobs_finished",
            "Jobs that ended within the window, per status.",
            ["status"],
            (((s,), n) for s, n in reading.finished.items()),
        )
        yield _gauge(
            "ratchet_recent_jobs_sampled",
            "Finished jobs of the window the wait and run times were read from (the newest, "
            "at most the sample limit).",
            [],
            [((), reading.sampled)],
        )
        yield self._histogram(
            "ratchet_recent_job_wait_seconds",
            "Seconds from due time to start of jobs that ended within the window, per task.",
            ["task"],
            (((task,), d) for task, d in reading.waits.items()),
        )
        yield self._histogram(
            "ratchet_recent_job_run_seconds",
            "Seconds from start to end of jobs that ended within the window, per task and status.",
            ["task", "status"],
            reading.runs.items(),
        )

    def _histogram(
        self,
        name: str,
        documentation: str,
        labels: list[str],
        values: Iterable[tuple[tuple[str, ...], Durations]],
    ) -> Metric:
        family = GaugeHistogramMetricFamily(name, documentation, labels=labels)
        for key, durations in values:
            buckets = [
                (_bound(b), float(n)) for b, n in zip(self.buckets, durations.at_most, strict=True)
            ]
            buckets.append(("+Inf", float(durations.count)))
            family.add_metric(list(key), buckets, durations.total)
        return family


def _bound(seconds: float) -> str:
    return repr(float(seconds))


def _gauge(
    name: str,
    documentation: str,
    labels: list[str],
    values: Iterable[tuple[tuple[str, ...], float]],
) -> Metric:
    family = GaugeMetricFamily(name, documentation, labels=labels)
    for key, value in values:
        family.add_metric(list(key), float(value))
    return family


def exposition(collector: StoreCollector) -> Callable[..., Iterable[bytes]]:
    """A WSGI application answering every GET with ``collector``'s metrics, in the format the
    scraper asks for (Prometheus' text or OpenMetrics), compressed when it accepts gzip."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    app: Callable[..., Iterable[bytes]] = make_wsgi_app(registry)
    return app
