"""Flower on a ratchet app in a real headless browser (Debian's chromium, driven by Playwright):
a task a real worker ran is on the Tasks page, the worker's page opens with its pool, queues
and registered tasks, and a revoke with terminate from Flower's API ends a running job as
REVOKED in the store."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from tests.acceptance.conftest import Cluster
from tests.acceptance.flower import PATIENCE, flower_running, require_flower, start_watched_worker
from tests.conftest import IN_CI
from tests.helpers import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.infra]

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
#: Milliseconds Playwright waits for a page's condition.
PAGE_PATIENCE = PATIENCE * 1000


@pytest.fixture
def browser_page(tmp_path: Path) -> Iterator[Any]:
    if not Path(CHROMIUM).exists() or shutil.which(CHROMIUM) is None:
        if IN_CI:
            pytest.fail(f"{CHROMIUM} is missing (package chromium, installed by .ci/infra.sh)")
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium)")
    if not IN_CI:
        pytest.importorskip("playwright", reason="Playwright is in the test extra")
    from playwright.sync_api import sync_playwright

    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    with sync_playwright() as playwright:
        # A persistent context is how Playwright starts a browser on a given --user-data-dir
        # (its launch() refuses that flag): a fresh, empty profile for this test only.
        context = playwright.chromium.launch_persistent_context(
            str(profile), executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS
        )
        try:
            yield context.new_page()
        finally:
            context.close()


@pytest.mark.parametrize("dialect", ["postgresql"], indirect=True)
def test_flower_in_a_browser(
    ratchet_app: Celery, cluster: Cluster, tmp_path: Path, browser_page: Any
) -> None:
    require_flower()
    page = browser_page
    _, node = start_watched_worker(cluster)
    try:
        with flower_running(ratchet_app, tmp_path) as flower:
            flower.wait_for_events_of(node)
            done = ratchet_app.tasks["acc.double"].delay(4)
            assert done.get(timeout=PATIENCE) == 8

            page.goto(f"{flower.base}/tasks")
            page.wait_for_selector(f"#tasks-table >> text={done.id}", timeout=PAGE_PATIENCE)
            assert "acc.double" in page.inner_text("#tasks-table")

            wait_until(
                lambda: node in flower.json("GET", "/api/workers?refresh=1"),
                PATIENCE,
                "the worker to answer Flower's inspect",
            )
            page.goto(f"{flower.base}/worker/{node}")
            assert page.inner_text("#workername") == node
            assert "concurrency" in page.inner_text("#tab-pool").lower()
            assert "celery" in page.inner_text("#worker-queues", timeout=PAGE_PATIENCE)
            assert page.locator("#tab-limits").get_by_text("acc.sleep").count() >= 1

            page.goto(f"{flower.base}/broker")
            assert "celery" in page.inner_text("#queue-table")

            running = ratchet_app.tasks["acc.sleep"].delay("flower-browser", 600)
            wait_until(
                lambda: flower.task_state(running.id) == "STARTED",
                PATIENCE,
                "Flower to see the long job start",
            )
            answer = page.evaluate(
                """async (path) => {
                    const response = await fetch(path, {method: "POST"});
                    return {status: response.status, body: await response.text()};
                }""",
                f"/api/task/revoke/{running.id}?terminate=true",
            )
            assert answer["status"] == 200, answer
            assert json.loads(answer["body"]) == {"message": f"Revoked '{running.id}'"}
            wait_until(lambda: running.state == "REVOKED", PATIENCE, "the job to be REVOKED")
    except Exception:
        print(cluster.logs())
        raise
