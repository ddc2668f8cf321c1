"""Real worker processes against rows forged with SQL: nothing in a row runs code."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.errors import SerializerNotAllowed
from tests.acceptance.conftest import ROOT, Cluster, wait_until
from tests.conftest import Servers, empty_store

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
    with pytest.raises(SerializerNotAllowed, match="ratchet_allow_pickle"):
        result.get(timeout=30)
    # Warned at start: the app's accept_content and ratchet_allow_pickle disagree.
    log = worker.log.read_text()
    assert "accept_content (or result_accept_content) lists pickle" in log, log[-3000:]
    # The client reading the row (extended results decode its arguments) runs nothing either.
    ratchet_app.conf.accept_content = ["json", "pickle"]
    ratchet_app.conf.result_extended = True
    try:
        ratchet_app._local.__dict__.pop("backend", None)  # a backend with the new lists
        assert ratchet_app.AsyncResult(result.id).args is None
        assert not marker.exists(), "the pickle in a forged row ran in the client"
    finally:
        ratchet_app.conf.accept_content = ["json"]
        ratchet_app.conf.result_extended = False
        ratchet_app._local.__dict__.pop("backend", None)


def test_passwords_never_reach_the_banner_the_logs_errors_or_celery_report(
    servers: Servers, tmp_path: Path
) -> None:
    """PostgreSQL (trust authentication) takes any password, so real workers run with them."""
    url = servers.url("postgresql")  # postgresql://postgres@host:port/db
    empty_store(url)
    head, _, rest = url.partition("@")
    with_passwords = f"{head}:{SECRETS[0]}@{rest}?password={SECRETS[1]}"
    cluster = Cluster(with_passwords, tmp_path)
    try:
        worker = cluster.start("w1")
        wait_until(lambda: "consuming" in worker.log.read_text(), 90, "the worker to consume")
        log = worker.log.read_text()
        assert "results:" in log and "password=***" in log, log[-3000:]
        assert_no_secret(log)
    finally:
        cluster.stop_all()
    # An unreachable store (an unencoded @ and spaces in the password): the error says where,
    # not with what.
    unreachable = f"postgresql://postgres:{SECRETS[2]}@127.0.0.1:1/x?sslpassword={SECRETS[1]}"
    failed = run_celery("tests.acceptance.app", "ratchet", "jobs", env={"RATCHET_URL": unreachable})
    output = failed.stdout + failed.stderr
    assert failed.returncode != 0 and "cannot reach the job store" in output, output
    assert_no_secret(output)
    # celery report prints the app's settings: the ratchet URLs are masked like Celery's own.
    (tmp_path / "report_app.py").write_text(
        "import os\n"
        "from celery import Celery\n"
        "app = Celery('report_app', task_cls='celery_ratchet:RatchetTask')\n"
        "app.conf.ratchet_url = os.environ['REPORT_URL']\n"
        "app.conf.ratchet_events_url = os.environ['REPORT_EVENTS_URL']\n"
        "@app.task\n"
        "def add(x, y):\n"
        "    return x + y\n"
    )
    report = run_celery(
        "report_app",
        "report",
        env={
            "REPORT_URL": with_passwords,
            "REPORT_EVENTS_URL": f"redis://:{SECRETS[0]}@127.0.0.1:6379/0",
            "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
        },
    )
    assert report.returncode == 0, report.stdout
    assert "ratchet_url: " in report.stdout and "ratchet_events_url: " in report.stdout
    assert_no_secret(report.stdout)


SECRETS = ("Zq1-userinfo", "Zq2 Kw9-query", "p@ss Zq3-unencoded")


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        for part in secret.split():
            assert part not in text, f"{part!r} leaked:\n{text[-3000:]}"


def run_celery(app: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", "-A", app, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
