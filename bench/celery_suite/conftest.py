"""Root conftest for Celery's own t/integration suite run against celery_ratchet.

run.sh copies it to the root of an unpacked Celery sdist; Celery's tests stay unchanged.
CELSUITE_FORM:
  taskcls  the suite's apps stay ``celery.Celery`` apps; only their task class is swapped
           (``task_cls="celery_ratchet:RatchetTask"``, a string: this file imports nothing of
           celery_ratchet, so ratchet is installed by the package's own first-use hook)
  ratchet  the suite's apps are ``celery_ratchet.Celery`` apps
  stock    nothing changed: Celery's broker and backend from TEST_BROKER / TEST_BACKEND
In the two ratchet forms the store is RATCHET_URL, the result backend TEST_BACKEND
(``ratchet://`` or ``redis://...``) and TEST_BROKER a closed port: nothing may reach a broker.
The session worker runs ``-P ratchet`` (CELSUITE_POOL names another).
CELSUITE_TIMEOUT: per-test timeout in seconds; the suite's own timeout marks are capped at it
(CELSUITE_IGNORE_MARKS=1: replaced by it).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

FORM = os.environ.get("CELSUITE_FORM", "taskcls")
TIMEOUT = float(os.environ.get("CELSUITE_TIMEOUT", "60"))

if FORM == "ratchet":
    import celery.contrib.testing.app as testing_app

    import celery_ratchet

    # The README's way to make a ratchet app: celery_ratchet.Celery for celery.Celery.
    testing_app.Celery = celery_ratchet.Celery  # type: ignore[misc]

if FORM == "taskcls":

    @pytest.fixture(scope="session")
    def celery_parameters() -> dict[str, Any]:
        return {"task_cls": "celery_ratchet:RatchetTask"}


if FORM != "stock":
    import celery.contrib.testing.worker as testing_worker

    # A ratchet app's worker runs `-P ratchet` (the pool by its path: this file imports
    # nothing of celery_ratchet in the task_cls form); the suite asks for prefork.
    POOL = os.environ.get("CELSUITE_POOL", "celery_ratchet.celery.execution.prefork:RatchetPool")
    _start_worker = testing_worker.start_worker

    def start_worker(app: Any, *args: Any, pool: str = "solo", **kwargs: Any) -> Any:
        return _start_worker(app, *args, pool=POOL, **kwargs)

    testing_worker.start_worker = start_worker


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        mark = item.get_closest_marker("timeout")
        wanted = TIMEOUT
        if mark is not None and not os.environ.get("CELSUITE_IGNORE_MARKS"):
            given = mark.kwargs.get("timeout", mark.args[0] if mark.args else TIMEOUT)
            wanted = min(float(given), TIMEOUT)
        item.add_marker(pytest.mark.timeout(wanted), append=False)
