"""The dashboard's pages: each reads through the store's operations (those of the CLI's
listings, ``ratchet stats``, ``jobs``, ``dlq``, ``schedules``, ``batches``, ``nodes``, and
the store's read-only views, :class:`~celery_ratchet.store.read_ports.Inspecting`) and names
the template that shows what it read."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from celery_ratchet.domain.batch import BatchState, shown_value
from celery_ratchet.domain.job import (
    JobStatus,
    JobSummary,
    parse_status,
    public_type,
    shown_status,
)
from celery_ratchet.runtime import recurring
from celery_ratchet.runtime.dlq import DeadLetterQueue
from celery_ratchet.store.read_ports import DashboardStore
from celery_ratchet.web import charts
from celery_ratchet.web.failures import exception_of, traceback_of
from celery_ratchet.web.templating import markup
from celery_ratchet.web.workers import Workers

PAGE_SIZE = 50
_STATUSES = [s.value for s in JobStatus]
Query = Mapping[str, list[str]]
Page = tuple[str, dict[str, Any]]

#: The windows the task pages offer: (name, seconds, spans of the charts).
WINDOWS = {
    "15m": (900, 60),
    "1h": (3600, 60),
    "6h": (6 * 3600, 72),
    "24h": (86400, 96),
    "7d": (7 * 86400, 84),
}
#: The ranges of the jobs list's "created" filter, besides from/to.
RANGES = {"15m": 900, "1h": 3600, "24h": 86400, "7d": 7 * 86400}


class NotFound(LookupError):
    """The page names a job or batch the store does not hold."""


class BadRequest(ValueError):
    """A value of the request's own query or form cannot be used (answered 400)."""


class Redirect(Exception):
    """The page is elsewhere (a search that names one job goes to that job)."""

    def __init__(self, path: str, query: Mapping[str, str]) -> None:
        super().__init__(path)
        self.path = path
        self.query = dict(query)


@dataclass(frozen=True)
class View:
    store: DashboardStore
    read_only: bool
    workers: Workers


def stored(status: str) -> str:
    """A status column's text as listings print it (an unknown one says so)."""
    return shown_status(parse_status(status))


def _status_order(status: str) -> tuple[int, str]:
    return (_STATUSES.index(status) if status in _STATUSES else len(_STATUSES), status)


def one(query: Query, name: str) -> str | None:
    """The value as sent: never stripped; only "" is none."""
    found = query.get(name)
    return found[0] if found and found[0] != "" else None


def _seconds(a: Any, b: Any) -> float | None:
    if isinstance(a, datetime) and isinstance(b, datetime):
        return (a - b).total_seconds()
    return None


def timings(j: JobSummary) -> dict[str, float | None]:
    """Wait (due → start) and run (start → end, or → now while running) of a job."""
    started = j.started_at if isinstance(j.started_at, datetime) else j.claimed_at
    return {"wait": _seconds(started, j.scheduled_time), "run": _seconds(j.finished_at, started)}


def overview(view: View, query: Query) -> Page:
    stats = view.store.queue_stats()
    per_minute = view.store.inspection.finished_per_minute(60)
    per_status: dict[str, int] = {}
    queues: dict[str, dict[str, int]] = {}
    for row in stats["counts"]:
        per_status[row["status"]] = per_status.get(row["status"], 0) + row["count"]
        queues.setdefault(row["queue"], {})[row["status"]] = row["count"]
    nodes = view.store.list_nodes()
    labels = [f"{len(per_minute) - i} min ago" for i in range(len(per_minute))]
    return "overview.html", {
        "statuses": [(s, stored(s), per_status[s]) for s in sorted(per_status, key=_status_order)],
        "queues": sorted(queues.items()),
        "shown": ("PENDING", "WAITING", "RUNNING", "SUCCEEDED", "FAILED", "REVOKED"),
        "oldest": stats["oldest_pending_seconds"],
        "finished": sum(per_minute),
        "chart": markup(
            charts.bars(per_minute, labels, label="jobs finished per minute", unit="/min")
        ),
        "workers": len(nodes),
        "running": sum(int(n.get("running") or 0) for n in nodes),
    }


def _when(text: str | None, name: str) -> datetime | None:
    """A moment from a form: ``2026-12-06T14:05`` (UTC, as the pages show times) or ISO."""
    if text is None:
        return None
    try:
        moment = datetime.fromisoformat(text.strip().replace(" ", "T"))
    except ValueError:
        raise BadRequest(f"{name}={text!r}: a time such as 2026-12-06T14:05 (UTC)") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def job_filters(query: Query) -> dict[str, Any]:
    """The jobs list's filters as sent (what the form and the pager carry on)."""
    wanted: dict[str, Any] = {
        name: one(query, name)
        for name in ("q", "status", "task", "queue", "tag", "key", "range", "since", "until")
    }
    wanted["ticks"] = one(query, "ticks") == "1"
    status = wanted["status"]
    if status is not None and status.upper() not in _STATUSES:
        raise BadRequest(f"status {status!r}: one of {', '.join(_STATUSES)}")
    if wanted["range"] is not None and wanted["range"] not in RANGES:
        raise BadRequest(f"range {wanted['range']!r}: one of {', '.join(RANGES)}")
    return wanted


def jobs(view: View, query: Query) -> Page:
    wanted = job_filters(query)
    search = wanted["q"]
    if search is not None and view.store.result(search) is not None:
        raise Redirect("/job", {"id": search})
    before = one(query, "before")
    if before is not None and not view.store.inspection.job_exists(before):
        raise BadRequest(
            f"before={before!r}: no such job (archived or deleted); start again from /jobs"
        )
    since = _when(wanted["since"], "since")
    until = _when(wanted["until"], "until")
    if wanted["range"] is not None:
        since = view.store.inspection.database_now() - timedelta(seconds=RANGES[wanted["range"]])
    status = wanted["status"]
    found = view.store.list_jobs(
        status=JobStatus(status.upper()) if status else None,
        task_name=wanted["task"],
        queue=wanted["queue"],
        tag=wanted["tag"],
        business_key=wanted["key"],
        limit=PAGE_SIZE + 1,
        before_job_id=before,
        task_contains=search,
        ticks=wanted["ticks"] or wanted["key"] is not None,
        created_since=since,
        created_until=until,
    )
    more, found = len(found) > PAGE_SIZE, found[:PAGE_SIZE]
    return "jobs.html", {
        "wanted": wanted,
        "statuses": _STATUSES,
        "ranges": list(RANGES),
        "rows": [(j, shown_status(j.status), timings(j)) for j in found],
        "older": {**wanted, "before": found[-1].job_id} if more else None,
        "first_page": before is not None,
    }


def job(view: View, query: Query) -> Page:
    job_id = one(query, "id")
    record = view.store.result(job_id) if job_id else None
    links = view.store.inspection.job_links(job_id) if job_id else None
    if record is None or links is None:
        raise NotFound(f"no job {job_id!r}")
    letter = DeadLetterQueue(view.store).show(record.job_id)
    started = links["started_at"] or links.get("claimed_at")
    summary: dict[str, Any] = {
        "job_id": record.job_id,
        "task": record.task_name,
        "queue": record.queue,
        "status": shown_status(record.status),
        "type": f"{links['job_type']} ({public_type(links['job_type'])})",
        "attempts": record.attempts,
        "claims": links["claims"],
        "priority": links["priority"],
        "due": links["scheduled_time"],
        "created": links["created_at"],
        "started": started,
        "finished": record.finished_at,
        "worker": record.picked_by,
        "business key": links["business_key"],
        "resource": links["resource"],
        "tags": (links["tags"] or "").strip(","),
    }
    status = record.status
    active = status in (JobStatus.PENDING, JobStatus.WAITING, JobStatus.RUNNING)
    payload = None
    if letter is None and record.payload is not None:
        payload = record.payload.decode("utf-8", "replace")
    return "job.html", {
        "job": record,
        "summary": summary,
        "wait": _seconds(started, links["scheduled_time"]),
        "run": _seconds(record.finished_at, started),
        "links": links,
        "dependents": [(d, stored(s)) for d, s in links["dependents"]],
        "letter": letter,
        "payload": payload,
        "exception": exception_of(record.last_error),
        "traceback": traceback_of(record.error_traceback),
        "log": view.store.job_log(record.job_id),
        "can_cancel": active,
        "can_terminate": status is JobStatus.RUNNING,
        "failed": status is JobStatus.FAILED,
    }


def dlq(view: View, query: Query) -> Page:
    task = one(query, "task")
    letters = DeadLetterQueue(view.store)
    found = letters.list(task_name=task, limit=PAGE_SIZE)
    alerts = letters.alerts_of(found)
    return "dlq.html", {
        "task": task,
        "rows": [(j, alerts[j.job_id], exception_of(j.last_error)) for j in found],
    }


def schedules(view: View, query: Query) -> Page:
    rows = []
    for s in recurring.describe(view.store, with_last_fire=True):
        last = s["last_fire"]
        fired = None
        if last:
            master = recurring.master_id(s["business_key"])
            fired = (last[0], recurring.occurrence_id(master, last[0]), shown_status(last[1]))
        rows.append((s, fired))
    return "schedules.html", {"rows": rows, "paused": JobStatus.PAUSED.value}


def batches(view: View, query: Query) -> Page:
    state = one(query, "state")
    known = [s.value for s in BatchState]
    if state is not None and state.upper() not in known:
        raise BadRequest(f"state {state!r}: one of {', '.join(known)}")
    wanted = BatchState(state.upper()) if state else None
    found = view.store.batches.summaries(state=wanted, limit=PAGE_SIZE)
    return "batches.html", {"rows": found, "shown_value": shown_value}


def batch(view: View, query: Query) -> Page:
    batch_id = one(query, "id")
    found = view.store.batches.summaries(batch_id=batch_id, limit=1) if batch_id else []
    if not found or batch_id is None:
        raise NotFound(f"no batch {batch_id!r}")
    children = view.store.inspection.children_by_status(batch_id)
    return "batch.html", {
        "b": found[0],
        "shown_value": shown_value,
        "children": [
            (stored(s), n) for s, n in sorted(children.items(), key=lambda i: _status_order(i[0]))
        ],
    }


def resources(view: View, query: Query) -> Page:
    rows = []
    for r in view.store.inspection.resources():
        capacity = r["capacity"]
        percent = 100.0 * len(r["held"]) / capacity if capacity else 0.0
        rows.append((r, percent))
    return "resources.html", {"rows": rows}


def _node_rows(view: View) -> tuple[datetime, list[dict[str, Any]]]:
    now = view.store.inspection.database_now()
    nodes = view.store.list_nodes()
    for n in nodes:
        beat = n.get("heartbeat_ts")
        n["age"] = (now - beat).total_seconds() if isinstance(beat, datetime) else None
        n["queue_list"] = [q for q in str(n.get("queues") or "").split(",") if q]
    return now, nodes


def nodes(view: View, query: Query) -> Page:
    _, found = _node_rows(view)
    return "nodes.html", {"nodes": found}


def node(view: View, query: Query) -> Page:
    node_id = one(query, "id")
    _, found = _node_rows(view)
    chosen = next((n for n in found if n["node_id"] == node_id), None)
    if chosen is None:
        raise NotFound(f"no worker {node_id!r} (it stopped, or was declared dead)")
    running = [
        (j, timings(j))
        for j in view.store.list_jobs(status=JobStatus.RUNNING, limit=500)
        if j.picked_by == node_id
    ]
    inspected = view.workers.inspect(chosen["hostname"])
    return "node.html", {"node": chosen, "running": running, "inspected": inspected}


def queues(view: View, query: Query) -> Page:
    stats = view.store.queue_stats()
    paused = view.store.paused_queues()
    later = view.store.inspection.scheduled_later()
    _, found = _node_rows(view)
    consumers: dict[str, list[str]] = {}
    for n in found:
        for q in n["queue_list"]:
            consumers.setdefault(q, []).append(n["hostname"])
    counts: dict[str, dict[str, int]] = {}
    for row in stats["counts"]:
        counts.setdefault(row["queue"], {})[row["status"]] = row["count"]
    names = sorted(set(counts) | set(consumers) | set(paused))
    rows = []
    for q in names:
        c = counts.get(q, {})
        pending = c.get("PENDING", 0)
        rows.append(
            {
                "queue": q,
                "due": pending - later.get(q, 0),
                "later": later.get(q, 0),
                "waiting": c.get("WAITING", 0),
                "running": c.get("RUNNING", 0),
                "failed": c.get("FAILED", 0),
                "oldest": stats["oldest_pending_seconds"].get(q),
                "consumers": consumers.get(q, []),
                "pending": pending,
                "paused": paused.get(q),
            }
        )
    return "queues.html", {"rows": rows}


def _window(query: Query) -> tuple[str, int, int]:
    name = one(query, "window") or "1h"
    if name not in WINDOWS:
        raise BadRequest(f"window {name!r}: one of {', '.join(WINDOWS)}")
    seconds, spans = WINDOWS[name]
    return name, seconds, spans


def tasks(view: View, query: Query) -> Page:
    name, seconds, _ = _window(query)
    rows = view.store.inspection.task_stats(seconds)
    for r in rows:
        ended = r["succeeded"] + r["failed"]
        r["failure_rate"] = 100.0 * r["failed"] / ended if ended else None
        r["per_minute"] = (r["succeeded"] + r["failed"] + r["revoked"]) / (seconds / 60)
    return "tasks.html", {"rows": rows, "window": name, "windows": list(WINDOWS)}


def task(view: View, query: Query) -> Page:
    task_name = one(query, "name")
    if task_name is None:
        raise BadRequest("name: the task's name")
    name, seconds, span_count = _window(query)
    series = view.store.inspection.task_series(task_name, seconds, span_count)
    now, width = series["now"], series["width_seconds"]
    spans = []
    for i, values in enumerate(series["spans"]):
        ended = now - timedelta(seconds=width * (span_count - 1 - i))
        done = values["succeeded"] + values["failed"]
        values["failure_rate"] = 100.0 * values["failed"] / done if done else None
        spans.append(charts.Span(f"to {ended:%Y-%m-%d %H:%M:%S}", values))
    totals = {
        k: sum(int(s.values[k] or 0) for s in spans) for k in ("succeeded", "failed", "revoked")
    }
    span_text = f"{width / 60:g} min" if width < 3600 else f"{width / 3600:g} h"
    return "task.html", {
        "name": task_name,
        "window": name,
        "windows": list(WINDOWS),
        "totals": totals,
        "span": span_text,
        "throughput": markup(
            charts.stacked_bars(spans, label=f"{task_name} jobs ended", unit=f"/ {span_text}")
        ),
        "failure_rate": markup(
            charts.line(spans, [("failure_rate", "#e53935")], label="failure rate", unit="%")
        ),
        "run_time": markup(
            charts.line(
                spans,
                [("run_avg", "#1e88e5"), ("run_max", "#fb8c00")],
                label="run time",
                unit="s",
            )
        ),
    }


#: The dashboard's pages by path: their titles and what makes them.
PAGES: dict[str, tuple[str, Callable[[View, Query], Page]]] = {
    "/": ("Overview", overview),
    "/jobs": ("Jobs", jobs),
    "/job": ("Job", job),
    "/tasks": ("Tasks", tasks),
    "/task": ("Task", task),
    "/queues": ("Queues", queues),
    "/nodes": ("Workers", nodes),
    "/node": ("Worker", node),
    "/dlq": ("Dead letters", dlq),
    "/schedules": ("Schedules", schedules),
    "/batches": ("Batches and workflows", batches),
    "/batch": ("Batch", batch),
    "/resources": ("Resources", resources),
}
