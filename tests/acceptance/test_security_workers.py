"""Real worker processes against rows forged with SQL: nothing in a row runs code."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import text

from celery_ratchet.celery.app import ratchet_state
from celery_ratchet.domain.job import JobStatus
from tests.acceptance.conftest import Cluster, wait_until

pytestmark = pytest.mark.slow


class _Touch:
    """Unpickling this runs a shell command: what a forged pickle row would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


def test_a_forged_pickle_row_is_failed_unrun_when_pickle_is_not_allowed(
    ratchet_app: Celery, cluster: Cluster, tmp_path: Path
) -> None:
    marker = tmp_path / "pickle-ran"
    result = ratchet_app.tasks["acc.double"].delay(21)
    store = ratchet_state(ratchet_app).store
    forged = pickle.dumps(([_Touch(marker)], {}, {"callbacks": None}), protocol=4)
    with store.engine.connect() as conn:
        conn.execute(
            text(
                "UPDATE scheduler_job SET payload = :p, content_type = :t, "
                "content_encoding = 'binary' WHERE job_id = :j"
            ),
            {"p": forged, "t": "application/x-python-serialize", "j": result.id},
        )
    # The app accepts pickle, but ratchet_allow_pickle is off: the worker must not.
    # (C_FORCE_ROOT: Celery itself refuses to start as root when pickle is accepted.)
    worker = cluster.start("w1", RATCHET_ACCEPTANCE_ACCEPT_CONTENT="json,pickle", C_FORCE_ROOT="1")
    ended = (JobStatus.FAILED, JobStatus.SUCCEEDED)
    wait_until(lambda: store.result(result.id).status in ended, 90, "the forged row to end")
    assert not marker.exists(), "the pickle in a forged row ran in the worker"
    record = store.result(result.id)
    assert record.status is JobStatus.FAILED, cluster.logs()
    assert "ratchet_allow_pickle" in (record.last_error or "")
    log = worker.log.read_text()
    assert "accept_content" in log and "ratchet_allow_pickle" in log, log[-3000:]
    # The client reading the row (extended results decode its arguments) runs nothing either.
    ratchet_app.conf.accept_content = ["json", "pickle"]
    ratchet_app.conf.result_extended = True
    try:
        ratchet_app.__dict__.pop("backend", None)
        ratchet_app._local.__dict__.pop("backend", None)
        assert ratchet_app.AsyncResult(result.id).args is None
        assert not marker.exists(), "the pickle in a forged row ran in the client"
    finally:
        ratchet_app.conf.accept_content = ["json"]
        ratchet_app.conf.result_extended = False
        ratchet_app._local.__dict__.pop("backend", None)
