"""Root conftest for Celery's own t/integration suite run against celery_ratchet.

run.sh copies it to the root of an unpacked Celery sdist; Celery's tests stay unchanged.
CELSUITE_MODE:
  ratchet  the suite's apps are ``celery_ratchet.Celery`` apps (task_cls RatchetTask) and its
           session worker runs ``-P ratchet``; store on RATCHET_URL, result backend from
           TEST_BACKEND (``ratchet://`` or ``redis://...``)
  stock    nothing changed: Celery's broker and backend from TEST_BROKER / TEST_BACKEND
CELSUITE_TIMEOUT: per-test timeout in seconds; the suite's own timeout marks are capped at it
(CELSUITE_IGNORE_MARKS=1: replaced by it).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

MODE = os.environ.get("CELSUITE_MODE", "ratchet")
TIMEOUT = float(os.environ.get("CELSUITE_TIMEOUT", "60"))

if MODE == "ratchet":
    import celery.contrib.testing.app as testing_app
    import celery.contrib.testing.worker as testing_worker

    import celery_ratchet
    import celery_ratchet.celery.commands  # registers the -P ratchet alias

    # The README's way to make a ratchet app: celery_ratchet.Celery for celery.Celery.
    testing_app.Celery = celery_ratchet.Celery  # type: ignore[misc]
    _start_worker = testing_worker.start_worker

    def start_worker(app: Any, *args: Any, pool: str = "solo", **kwargs: Any) -> Any:
        pool = os.environ.get("CELSUITE_POOL", "ratchet")
        return _start_worker(app, *args, pool=pool, **kwargs)

    testing_worker.start_worker = start_worker

    @pytest.fixture(scope="session")
    def celery_parameters() -> dict[str, Any]:
        return {"task_cls": "celery_ratchet:RatchetTask"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        mark = item.get_closest_marker("timeout")
        wanted = TIMEOUT
        if mark is not None and not os.environ.get("CELSUITE_IGNORE_MARKS"):
            given = mark.kwargs.get("timeout", mark.args[0] if mark.args else TIMEOUT)
            wanted = min(float(given), TIMEOUT)
        item.add_marker(pytest.mark.timeout(wanted), append=False)
