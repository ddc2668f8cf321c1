"""``GET /metrics`` on each database, read back with prometheus_client's own text parser and
checked against rows whose counts and times the test knows."""

from __future__ import annotations

import io
import json
import re
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from celery_ratchet.domain.job import JobStatus, Settlement
from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.runtime import recurring
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import scheduler_job, scheduler_node
from celery_ratchet.web.app import Dashboard
from celery_ratchet.web.guard import HostAllowlist
from tests.conftest import empty_store
from tests.helpers import new_job

job = scheduler_job
ROOT = Path(__file__).resolve().parents[2]
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(app: Any, path: str = "/metrics", **headers: str) -> tuple[str, dict[str, str], str]:
    environ: dict[str, Any] = {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": path,
        "QUERY_STRING": "",
        "HTTP_HOST": "127.0.0.1:5580",
        "wsgi.input": io.BytesIO(),
    }
    environ.update({"HTTP_" + k.upper(): v for k, v in headers.items()})  # host= replaces Host
    got: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        got.update(status=status, headers=dict(response_headers))

    body = b"".join(app(environ, start_response)).decode()
    return got["status"], got["headers"], body


def parsed(text: str) -> tuple[dict[str, str], Samples]:
    """Each family's type, and every sample by (name, labels)."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return types, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def _set(store: JobStore, job_id: str, **values: Any) -> None:
    with store.engine.begin() as conn:
        conn.execute(update(job).where(job.c.job_id == job_id).values(**values))


@pytest.fixture
def known(store: JobStore) -> JobStore:
    """Rows whose metrics the test knows, with times set relative to now."""
    now = datetime.now(timezone.utc)
    store.enqueue_many(
        [
            *[new_job(f"due-{i}") for i in range(3)],
            new_job("later", due=now + timedelta(hours=1)),
            new_job("slow-1", queue="slow"),
            new_job("run-1"),
            new_job("pay-1", resource="payments"),
            new_job("step-1", queue="slow"),
            *[new_job(f"ok-{i}") for i in range(3)],
            new_job("ok-old"),
            *[new_job(f"bad-{i}", task="tests.fail") for i in range(2)],
            new_job("bad-slow", task="tests.slow", queue="slow"),
        ]
    )
    # The jobs that end, and run-1, are claimed; the pending ones put back by id.
    ending = ["run-1", "ok-0", "ok-1", "ok-2", "ok-old", "bad-0", "bad-1"]
    for job_id in ("due-0", "due-1", "due-2"):
        _set(store, job_id, scheduled_time=now + timedelta(days=1))
    claimed = {j.job_id: j for j in store.claim("node-1", ["celery"], 50)}
    assert set(ending) <= set(claimed)
    assert store.claim_for_resource("node-1", ["celery"], "payments", 2, 10)
    slow = {j.job_id: j for j in store.claim("node-2", ["slow"], 10)}
    store.settle(
        [Settlement(i, claimed[i].token, JobStatus.SUCCEEDED) for i in ending[1:5]]
        + [Settlement(i, claimed[i].token, JobStatus.FAILED) for i in ending[5:]]
        + [Settlement("bad-slow", slow["bad-slow"].token, JobStatus.FAILED)]
    )
    for job_id in ("due-0", "due-1", "due-2"):
        _set(store, job_id, scheduled_time=now - timedelta(seconds=30 + int(job_id[-1])))
    _set(store, "step-1", status=JobStatus.WAITING.value, picked_by=None, claim_token=None)
    # Waited 0.4 s from due to start, ran 2 s, ended 10 s ago; ok-old ended an hour ago.
    for job_id in ("ok-0", "ok-1", "ok-2", "bad-0"):
        _set(
            store,
            job_id,
            scheduled_time=now - timedelta(seconds=12.4),
            claimed_at=now - timedelta(seconds=12),
            finished_at=now - timedelta(seconds=10),
        )
    _set(
        store,
        "bad-1",
        scheduled_time=now - timedelta(seconds=95),
        claimed_at=now - timedelta(seconds=70),
        finished_at=now - timedelta(seconds=12),
    )
    _set(store, "ok-old", finished_at=now - timedelta(hours=1))
    store.register_node("node-1", "host-a", 101, ["celery"], 4)
    store.register_node("node-2", "host-b", 102, ["slow"], 2)
    store.register_node("node-3", "host-c", 103, ["celery"], 8)
    with store.engine.begin() as conn:
        conn.execute(
            update(scheduler_node)
            .where(scheduler_node.c.node_id == "node-3")
            .values(heartbeat_ts=now - timedelta(minutes=10))
        )
    for key in ("nightly", "hourly", "weekly"):
        recurring.register(
            store,
            key,
            MasterSpec("cron:0 0 3 * * ?", "UTC"),
            task_name="tests.tick",
            priority=4,
            message=new_job("t").message,
        )
    recurring.pause(store, "weekly")
    store.pause_queue("slow", "relay down")
    _set(store, recurring.master_id("hourly"), scheduled_time=now - timedelta(seconds=45))
    return store


def test_metrics_are_read_back_by_prometheus_own_parser(known: JobStore) -> None:
    status, headers, body = scrape(Dashboard(known))
    assert status == "200 OK"
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    types, samples = parsed(body)
    assert types["ratchet_jobs"] == "gauge"
    assert value(samples, "ratchet_jobs", queue="celery", status="PENDING") == 4
    assert value(samples, "ratchet_jobs", queue="celery", status="RUNNING") == 2
    assert value(samples, "ratchet_jobs", queue="slow", status="RUNNING") == 1
    assert value(samples, "ratchet_jobs", queue="slow", status="WAITING") == 1
    jobs = {k[1] for k in samples if k[0] == "ratchet_jobs"}
    assert len(jobs) == 4, "only jobs not finished are counted; schedules are not jobs"
    assert value(samples, "ratchet_queue_due_jobs", queue="celery") == 3
    oldest = value(samples, "ratchet_queue_oldest_due_age_seconds", queue="celery")
    assert 32 <= oldest < 32 + 600
    assert ("ratchet_queue_due_jobs", frozenset({("queue", "slow")})) not in samples

    assert value(samples, "ratchet_dead_letters", queue="celery") == 2
    assert value(samples, "ratchet_dead_letters", queue="slow") == 1
    assert 0 <= value(samples, "ratchet_queue_paused_seconds", queue="slow") < 600
    assert ("ratchet_queue_paused_seconds", frozenset({("queue", "celery")})) not in samples

    assert value(samples, "ratchet_nodes_alive") == 2
    assert value(samples, "ratchet_node_up", node="node-1", hostname="host-a") == 1
    assert value(samples, "ratchet_node_up", node="node-3", hostname="host-c") == 0
    assert value(samples, "ratchet_node_heartbeat_age_seconds", node="node-3") >= 600
    assert value(samples, "ratchet_node_concurrency", node="node-3") == 8
    assert value(samples, "ratchet_node_running_jobs", node="node-1") == 2
    assert value(samples, "ratchet_node_running_jobs", node="node-2") == 1
    assert value(samples, "ratchet_node_running_jobs", node="node-3") == 0

    assert value(samples, "ratchet_resource_capacity", resource="payments") == 2
    assert value(samples, "ratchet_resource_permits_in_use", resource="payments") == 1

    assert value(samples, "ratchet_schedules", state="active") == 2
    assert value(samples, "ratchet_schedules", state="paused") == 1
    assert value(samples, "ratchet_schedules_late") == 1
    assert 45 <= value(samples, "ratchet_schedule_lateness_seconds", schedule="hourly") < 645
    assert not [k for k in samples if k[0] == "ratchet_schedule_lateness_seconds" and k != (
        "ratchet_schedule_lateness_seconds", frozenset({("schedule", "hourly")}))]  # fmt: skip

    assert value(samples, "ratchet_recent_window_seconds") == 300
    assert value(samples, "ratchet_recent_jobs_finished", status="SUCCEEDED") == 3
    assert value(samples, "ratchet_recent_jobs_finished", status="FAILED") == 3
    assert value(samples, "ratchet_recent_jobs_sampled") == 6


def test_wait_and_run_times_are_histograms_of_the_recent_window(known: JobStore) -> None:
    types, samples = parsed(scrape(Dashboard(known))[2])
    assert types["ratchet_recent_job_wait_seconds"] == "histogram"
    assert types["ratchet_recent_job_run_seconds"] == "histogram"

    def bucket(name: str, le: str, **labels: str) -> float:
        return value(samples, f"{name}_bucket", le=le, **labels)

    wait, run = "ratchet_recent_job_wait_seconds", "ratchet_recent_job_run_seconds"
    # tests.add: ok-0..2 waited 0.4 s and ran 2 s; ok-old ended before the window.
    assert bucket(wait, "0.25", task="tests.add") == 0
    assert bucket(wait, "0.5", task="tests.add") == 3
    assert bucket(wait, "+Inf", task="tests.add") == 3
    assert value(samples, f"{wait}_gsum", task="tests.add") == pytest.approx(1.2, abs=0.01)
    assert value(samples, f"{wait}_gcount", task="tests.add") == 3
    assert bucket(run, "1.0", task="tests.add", status="SUCCEEDED") == 0
    assert bucket(run, "2.5", task="tests.add", status="SUCCEEDED") == 3
    # tests.fail: bad-0 waited 0.4 s, ran 2 s; bad-1 waited 25 s, ran 58 s; both FAILED.
    assert bucket(wait, "0.5", task="tests.fail") == 1
    assert bucket(wait, "30.0", task="tests.fail") == 2
    assert value(samples, f"{wait}_gsum", task="tests.fail") == pytest.approx(25.4, abs=0.01)
    assert bucket(run, "2.5", task="tests.fail", status="FAILED") == 1
    assert bucket(run, "60.0", task="tests.fail", status="FAILED") == 2
    assert value(samples, f"{run}_gsum", task="tests.fail", status="FAILED") == pytest.approx(
        60, abs=0.01
    )


def test_openmetrics_is_served_to_a_scraper_that_asks_for_it(known: JobStore) -> None:
    accept = "application/openmetrics-text; version=1.0.0"
    status, headers, body = scrape(Dashboard(known), accept=accept)
    assert status == "200 OK" and headers["Content-Type"].startswith("application/openmetrics")
    assert "# TYPE ratchet_recent_job_run_seconds gaugehistogram" in body
    assert body.rstrip().endswith("# EOF")


def test_metrics_ask_for_what_the_pages_ask_for(tmp_path: Path) -> None:
    """Loopback names only unless told, and the dashboard's credentials when it has some."""
    store = empty_store(f"sqlite:///{tmp_path / 'auth.db'}")
    guarded = Dashboard(store, auth="scraper-token-0123456789")
    assert scrape(guarded)[0].startswith("401")
    status, _, body = scrape(guarded, authorization="Bearer scraper-token-0123456789")
    assert status == "200 OK" and "ratchet_jobs" in body
    assert scrape(Dashboard(store), host="metrics.example")[0].startswith("403")
    named = Dashboard(store, hosts=HostAllowlist(frozenset({"metrics.example"}), loopback=False))
    assert scrape(named, host="metrics.example")[0] == "200 OK"


def test_without_prometheus_client_metrics_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "celery_ratchet.web.metrics", raising=False)
    store = empty_store(f"sqlite:///{tmp_path / 'bare.db'}")
    status, _, body = scrape(Dashboard(store))
    assert status.startswith("501") and "celery-ratchet[metrics]" in body


def test_the_grafana_dashboard_uses_only_metrics_a_scrape_has(known: JobStore) -> None:
    grafana = json.loads((ROOT / "docs" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in grafana["panels"] for t in p.get("targets", ())] + [
        v["definition"] for v in grafana["templating"]["list"]
    ]
    used = {name for e in exprs for name in re.findall(r"\bratchet_[a-z_]+", e)}
    _, samples = parsed(scrape(Dashboard(known))[2])
    served = {name for name, _ in samples}
    assert used and used <= served, used - served
