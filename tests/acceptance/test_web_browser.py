"""The dashboard in a real headless browser (Debian's chromium, driven by Playwright; never a
downloaded browser) beside a real worker: counts, a dead letter retried from the page, a
schedule paused from the page, a batch's progress, the CSRF refusal and the 401.

Takes a screenshot of each page, into the test's own directory; with
``RATCHET_SCREENSHOTS=docs/web`` into the README's pictures (a checkout under test is never
rewritten by a plain run)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

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

    def __init__(self, url: str, log: Path, **env: str) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        with log.open("wb") as out:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "celery_ratchet.cli.main", "--url", url, "web",
                 "--port", str(self.port)],
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


@pytest.mark.parametrize("dialect", ["sqlite"])
def test_the_dashboard_in_a_browser_beside_a_worker(
    ratchet_app: Celery, cluster: Cluster, web: WebServer, tmp_path: Path
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
    batch = group(tasks["acc.value"].si(i) for i in range(5)).apply_async()
    cluster.start("w1", pool="threads", concurrency=2, RATCHET_ACCEPTANCE_RECURRING="tick")
    wait_until(lambda: all(_status_of(store, r.id) is JobStatus.SUCCEEDED for r in done), 60,
               "the three jobs to succeed")  # fmt: skip
    wait_until(lambda: _status_of(store, failing.id) is JobStatus.FAILED, 60, "the failure")
    assert batch.get(timeout=60) == list(range(5))
    wait_until(lambda: any(k.startswith("tick@") for k, _ in side_effects(store)), 30, "a tick")

    with sync_playwright() as driver:
        browser = driver.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})

            page.goto(web.base + "/")
            counts = page.locator("table").first
            assert counts.locator("tr", has_text="FAILED").locator("td").nth(1).inner_text() == (
                "1"
            )
            succeeded = counts.locator("tr", has_text="SUCCEEDED").locator("td").nth(1)
            assert int(succeeded.inner_text()) >= 3 + 5
            assert page.locator("svg.chart rect").count() == 60
            page.screenshot(path=str(shots / "overview.png"), full_page=True)

            page.goto(web.base + "/jobs")
            page.screenshot(path=str(shots / "jobs.png"), full_page=True)
            page.goto(f"{web.base}/job?id={failing.id}")
            assert "no marker file" in page.locator("body").inner_text()
            page.screenshot(path=str(shots / "job.png"), full_page=True)

            page.goto(web.base + "/dlq")
            row = page.locator("tr", has_text=failing.id)
            assert row.count() == 1
            page.screenshot(path=str(shots / "dead-letters.png"), full_page=True)
            marker.write_text("")
            row.get_by_role("button", name="retry").click()
            page.wait_for_url("**/dlq?note=*")
            assert "requeued 1 job" in page.get_by_role("status").inner_text()
            wait_until(lambda: _status_of(store, failing.id) is JobStatus.SUCCEEDED, 60,
                       "the retried job to succeed")  # fmt: skip
            assert failing.get(timeout=30) == "mended"

            page.goto(web.base + "/schedules")
            schedule = page.locator("tr", has_text="acc-tick")
            schedule.get_by_role("button", name="pause").click()
            page.wait_for_url("**/schedules?note=*")
            assert schedule.get_by_role("button", name="resume").count() == 1
            page.screenshot(path=str(shots / "schedules.png"), full_page=True)
            # Ticks fired before the pause (a late master fires its overdue ones together)
            # run out first; from then on a paused schedule fires none, but for one whose
            # firing was under way as it was paused.
            wait_until(lambda: not _ticks_unfinished(store), 60, "the fired ticks to end")
            paused_ticks = sum(1 for k, _ in side_effects(store) if k.startswith("tick@"))
            # A job that ends two seconds from now: the worker runs on meanwhile.
            later = tasks["acc.until"].delay(1, time.time() + 2.5)
            assert later.get(timeout=60) == 1
            ticks = sum(1 for k, _ in side_effects(store) if k.startswith("tick@"))
            assert ticks <= paused_ticks + 1

            page.goto(web.base + "/batches")
            progress = page.locator("tr", has_text=batch.id).get_by_role("progressbar")
            assert progress.get_attribute("aria-valuenow") == "100"
            page.screenshot(path=str(shots / "batches.png"), full_page=True)
            page.goto(f"{web.base}/batch?id={batch.id}")
            assert "SUCCEEDED" in page.locator("body").inner_text()
            for name, path in (("resources", "/resources"), ("nodes", "/nodes")):
                page.goto(web.base + path)
                page.screenshot(path=str(shots / f"{name}.png"), full_page=True)
            assert "w1@" in page.locator("body").inner_text()

            # An action without its CSRF token (another site's form) is refused.
            form = f"job_id={failing.id}".encode()
            assert _status(web.base + "/dlq/purge", form) == 403
            assert _status_of(store, failing.id) is JobStatus.SUCCEEDED

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
            finally:
                guarded.stop()
        finally:
            browser.close()
