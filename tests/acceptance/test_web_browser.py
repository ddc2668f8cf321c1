"""The dashboard in a real headless browser (Debian's chromium, driven by Playwright; never a
downloaded browser) beside a real prefork worker, on SQLite and PostgreSQL: every page, and
each action through its page (cancel, bulk cancel, terminate, retry, run now, pause, purge a
queue, rate and time limits, pool grow/shrink, autoscale, consumers, shut down), search,
filters, the recurring ticks' toggle, live refresh, the CSRF refusal, read-only and the 401.

Takes a screenshot of each page, into the test's own directory; with
``RATCHET_SCREENSHOTS=docs/web`` into the pictures of docs/how-to/dashboard.md (a checkout
under test is never rewritten by a plain run)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery, group

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.conftest import Cluster, side_effects
from tests.conftest import IN_CI
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]

pytestmark = [pytest.mark.slow, pytest.mark.infra]


def _needs_browser() -> None:
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (apt-get install chromium; .ci/infra.sh does)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        missing.append("the playwright package (the test extra)")
    if missing:
        message = "the browser test needs " + " and ".join(missing)
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _status(url: str, data: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=10) as got:
            return int(got.status)
    except urllib.error.HTTPError as exc:
        exc.close()  # the error holds the response's socket
        return int(exc.code)


class WebServer:
    """``ratchet --url URL web`` as its own process, on a free port."""

    def __init__(self, url: str, log: Path, *args: str, **env: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        with log.open("wb") as out:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery_ratchet.cli.main", "--url", url, "web",
                 "--port", str(self.port), *args],
                cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

        def answers() -> bool:
            try:
                return _status(self.base + "/nodes") in (200, 401)
            except OSError:
                return False

        wait_until(answers, 30, "ratchet web to answer")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(30)


@pytest.fixture
def web(cluster: Cluster, tmp_path: Path) -> Iterator[WebServer]:
    server = WebServer(cluster.url, tmp_path / "web.log")
    yield server
    server.stop()


def _ticks_unfinished(store: JobStore) -> int:
    return sum(
        len(store.list_jobs(status=status, task_name="acc.tick", limit=100))
        for status in (JobStatus.PENDING, JobStatus.RUNNING)
    )


def _status_of(store: JobStore, job_id: str) -> JobStatus | str | None:
    record = store.result(job_id)
    return None if record is None else record.status


def _note(page: Any) -> str:
    return str(page.get_by_role("status").inner_text())


def _act(page: Any, button: Any, *, confirm: bool = False) -> str:
    """Click ``button`` (confirming when asked) and return the note the page comes back with."""
    button.click()
    if confirm:
        page.get_by_role("button", name=re.compile("^yes, ")).click()
    page.wait_for_selector("[role=status]")
    return _note(page)


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
def test_the_dashboard_in_a_browser_beside_a_worker(
    ratchet_app: Celery, cluster: Cluster, web: WebServer, tmp_path: Path, dialect: str
) -> None:
    _needs_browser()
    from playwright.sync_api import sync_playwright

    wanted = os.environ.get("RATCHET_SCREENSHOTS")
    shots = (ROOT / wanted) if wanted else tmp_path / "screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    store = ratchet_state(ratchet_app).store
    marker = tmp_path / "mended"
    tasks = ratchet_app.tasks
    done = [tasks["acc.value"].delay(i) for i in range(3)]
    failing = tasks["acc.needs_marker"].delay(str(marker))
    boom = tasks["acc.boom"].delay("the card was declined")
    batch = group(tasks["acc.value"].si(i) for i in range(5)).apply_async()
    later = [tasks["acc.value"].apply_async((i,), countdown=3600) for i in range(3)]
    parked = [tasks["acc.value"].apply_async((i,), queue="parked") for i in range(2)]
    sleeper = tasks["acc.sleep"].delay("sleeper", 300)
    worker = cluster.start("w1", concurrency=2, RATCHET_ACCEPTANCE_RECURRING="tick")
    wait_until(lambda: all(_status_of(store, r.id) is JobStatus.SUCCEEDED for r in done), 60,
               "the three jobs to succeed")  # fmt: skip
    wait_until(lambda: _status_of(store, failing.id) is JobStatus.FAILED, 60, "the failure")
    wait_until(lambda: _status_of(store, boom.id) is JobStatus.FAILED, 60, "the other failure")
    wait_until(lambda: _status_of(store, sleeper.id) is JobStatus.RUNNING, 60, "the sleeper")
    assert batch.get(timeout=60) == list(range(5))
    wait_until(lambda: any(k.startswith("tick@") for k, _ in side_effects(store)), 30, "a tick")
    page_shot = _shooter(shots)

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 860})

            # -- overview, with live refresh ------------------------------------------------
            page.goto(web.base + "/")
            counts = page.locator("table.counts")
            assert counts.locator("tr", has_text="FAILED").locator("td").nth(1).inner_text() == (
                "2"
            )
            assert int(counts.locator("tr", has_text="SUCCEEDED").locator("td").nth(1)
                       .inner_text()) >= 3 + 5  # fmt: skip
            assert page.locator("svg.chart g.bar").count() == 60
            page_shot(page, "overview")

            # -- jobs: columns, ticks hidden, search, filters, live refresh ---------------------
            page.goto(web.base + "/jobs")
            assert page.locator("th", has_text="wait").count() == 1
            assert "recurring:" not in page.locator("table.jobs").inner_text()
            page.get_by_label("recurring ticks").check()
            page.get_by_role("button", name="filter").click()
            page.wait_for_url("**ticks=1**")
            assert "recurring:acc-tick@" in page.locator("table.jobs").inner_text()
            page.goto(web.base + "/jobs")
            fresh = tasks["acc.value"].apply_async((7,), countdown=3600)
            page.locator("table.jobs", has_text=fresh.id).wait_for(timeout=20_000)  # no reload
            page_shot(page, "jobs")
            page.get_by_label("search jobs").fill("NEEDS_MARK")
            page.get_by_label("search jobs").press("Enter")
            page.wait_for_url("**/jobs?q=NEEDS_MARK")
            assert page.locator("table.jobs").inner_text().count(failing.id) == 1
            page.goto(f"{web.base}/jobs?range=15m&status=FAILED")
            assert boom.id in page.locator("table.jobs").inner_text()
            page.goto(f"{web.base}/jobs?until=2000-01-01T00:00")
            assert "none" in page.locator("table.jobs").inner_text()
            page.get_by_label("search jobs").fill(boom.id)
            page.get_by_label("search jobs").press("Enter")
            page.wait_for_url(f"**/job?id={boom.id}")

            # -- a failure, readable --------------------------------------------------------
            assert "RuntimeError: the card was declined" in page.locator(".exception").inner_text()
            assert page.locator("ol.traceback li.app").count() >= 1
            page_shot(page, "job")

            # -- cancel one pending job, then two at once, and terminate a running one -----
            page.goto(f"{web.base}/job?id={later[0].id}")
            note = _act(page, page.get_by_role("button", name="cancel (revoke)"), confirm=True)
            assert "1 not started yet (revoked)" in note
            assert _status_of(store, later[0].id) is JobStatus.REVOKED
            page.goto(f"{web.base}/jobs?status=PENDING&queue=celery")
            for result in later[1:]:
                page.get_by_label(f"tick {result.id}").check()
            note = _act(page, page.get_by_role("button", name="cancel", exact=True), confirm=True)
            assert "cancelled: 2 not started yet" in note
            assert all(_status_of(store, r.id) is JobStatus.REVOKED for r in later[1:])
            page.goto(f"{web.base}/job?id={sleeper.id}")
            note = _act(page, page.get_by_role("button", name="terminate"), confirm=True)
            assert "1 running (their workers terminate them)" in note
            wait_until(lambda: _status_of(store, sleeper.id) is JobStatus.REVOKED, 60,
                       "the sleeper to be terminated")  # fmt: skip

            # -- dead letters ----------------------------------------------------------------
            page.goto(web.base + "/dlq")
            row = page.locator("tr", has_text=failing.id)
            assert row.count() == 1
            page_shot(page, "dead-letters")
            marker.write_text("")
            assert "requeued 1 job" in _act(page, row.get_by_role("button", name="retry"))
            wait_until(lambda: _status_of(store, failing.id) is JobStatus.SUCCEEDED, 60,
                       "the retried job to succeed")  # fmt: skip
            assert failing.get(timeout=30) == "mended"

            # -- schedules: run now, pause --------------------------------------------------
            page.goto(web.base + "/schedules")
            schedule = page.locator("tr", has_text="acc-tick")
            fired = len([k for k, _ in side_effects(store) if k.startswith("tick@")])
            assert "due now" in _act(page, schedule.get_by_role("button", name="run now"))
            wait_until(
                lambda: len([k for k, _ in side_effects(store) if k.startswith("tick@")]) > fired,
                30, "the tick run now",
            )  # fmt: skip
            assert "paused" in _act(page, schedule.get_by_role("button", name="pause"))
            assert schedule.get_by_role("button", name="resume").count() == 1
            page_shot(page, "schedules")

            # -- tasks and one task's charts, with its limits ------------------------------
            page.goto(web.base + "/tasks")
            assert page.locator("tr", has_text="acc.boom").locator("td").nth(4).inner_text() == (
                "100.0 %"
            )
            page_shot(page, "tasks")
            page.locator("a", has_text="acc.value").first.click()
            page.wait_for_url("**/task?name=acc.value**")
            assert page.locator("svg.chart").count() == 3
            assert page.locator("svg.chart circle.point").count() >= 1
            page_shot(page, "task")
            page.get_by_label("rate limit").fill("100/m")
            note = _act(page, page.get_by_role("button", name="set", exact=True))
            assert "new rate limit set successfully" in note, note
            page.get_by_label("soft").fill("50")
            page.get_by_label("hard").fill("60")
            note = _act(page, page.get_by_role("button", name="set time limits"))
            assert "time limits set successfully" in note, note

            # -- queues ----------------------------------------------------------------------
            page.goto(web.base + "/queues")
            parked_row = page.locator("tr", has_text="parked")
            assert parked_row.locator("td").nth(1).inner_text() == "2"
            page_shot(page, "queues")
            note = _act(page, parked_row.get_by_role("button", name="purge pending"), confirm=True)
            assert "deleted 2 pending jobs of parked" in note
            assert all(store.result(r.id) is None for r in parked)

            # -- workers: pool, autoscale, consumers, shut down ------------------------------
            page.goto(web.base + "/nodes")
            assert "w1@" in page.locator("table").inner_text()
            page_shot(page, "workers")
            page.locator("a", has_text="w1@").click()
            page.wait_for_url("**/node?id=*")
            assert _processes(page) == "2"
            page_shot(page, "worker")
            assert "pool will grow" in _act(page, page.get_by_role("button", name="grow pool"))
            wait_until(lambda: _processes(page) == "3", 30, "the pool to grow")
            shrink = page.get_by_role("button", name="shrink pool")
            assert "pool will shrink" in _act(page, shrink)
            page.get_by_label("max").fill("4")
            page.get_by_label("min").fill("1")
            note = _act(page, page.get_by_role("button", name="autoscale"))
            assert "Autoscale not enabled" in note, note  # started without --autoscale
            page.get_by_label("queue", exact=True).fill("extra")
            consume = page.get_by_role("button", name="consume from")
            assert "add consumer extra" in _act(page, consume)
            assert "extra" in page.locator("tr", has_text="queues").first.inner_text()
            page.get_by_label("queue", exact=True).fill("extra")
            note = _act(page, page.get_by_role("button", name="stop consuming"))
            assert "no longer consuming from extra" in note, note

            # -- batches and resources ---------------------------------------------------------
            page.goto(web.base + "/batches")
            progress = page.locator("tr", has_text=batch.id).get_by_role("progressbar")
            assert progress.get_attribute("aria-valuenow") == "100"
            page_shot(page, "batches")
            page.goto(f"{web.base}/batch?id={batch.id}")
            assert "SUCCEEDED" in page.locator("body").inner_text()
            page.goto(web.base + "/resources")
            page_shot(page, "resources")

            # An action without its CSRF token (another site's form) is refused.
            form = f"job_id={boom.id}".encode()
            assert _status(web.base + "/dlq/purge", form) == 403
            assert _status_of(store, boom.id) is JobStatus.FAILED

            read_only = WebServer(cluster.url, tmp_path / "ro.log", "--read-only")
            try:
                page.goto(f"{read_only.base}/job?id={boom.id}")
                assert page.locator("form[method=post]").count() == 0
                assert page.locator(".ro").inner_text() == "read-only"
            finally:
                read_only.stop()

            guarded = WebServer(cluster.url, tmp_path / "guarded.log", RATCHET_WEB_AUTH="u:pw")
            try:
                # The browser's own request, without credentials: chromium would show its
                # sign-in prompt (an error, headless) where the answer is 401.
                anonymous = browser.new_context().request.get(guarded.base + "/")
                assert anonymous.status == 401
                signed_in = browser.new_context(http_credentials={"username": "u",
                                                                  "password": "pw"})  # fmt: skip
                answer = signed_in.new_page().goto(guarded.base + "/")
                assert answer is not None and answer.status == 200
                assert "pw" not in answer.text()
            finally:
                guarded.stop()

            # Last: shut the worker down from its page (it finishes what it runs, and exits).
            page.goto(web.base + "/nodes")
            note = _act(page, page.get_by_role("button", name="shut down"), confirm=True)
            assert "told to shut down" in note
            worker.process.wait(60)
        finally:
            browser.close()


def _processes(page: Any) -> str:
    """How many processes the worker's pool has, as its page says (read afresh)."""
    page.reload()
    return str(page.locator("tr", has_text="pool processes").locator(".count").inner_text())


def _shooter(shots: Path) -> Any:
    def shoot(page: Any, name: str) -> None:
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

    return shoot
