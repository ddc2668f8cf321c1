"""The database server's disk fills up: a statement it refuses for want of space (PostgreSQL's
disk_full, 53100; MariaDB's "table is full", 1114, or errno 28) wrote nothing. A send says
so, as StoreFull, and never "outcome unknown: it may have been committed"; once space is
freed, sends go through again.

Each server is a private one this test starts, its files on a small tmpfs of its own that
the test fills (mounting needs root: skipped where it cannot mount).
"""

from __future__ import annotations

import contextlib
import errno
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from celery import Celery

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import StoreFull, StoreUnavailable
from celery_ratchet.store.engine import engine_for
from tests.acceptance.conftest import _app_on, wait_until
from tests.private_postgres import start_private_postgres
from tests.private_servers import PrivateMariaDB

pytestmark = [pytest.mark.slow, pytest.mark.infra]


@contextlib.contextmanager
def small_tmpfs(megabytes: int) -> Iterator[Path]:
    mount = Path(tempfile.mkdtemp(prefix="ratchet-tmpfs-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={megabytes}m,mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        mount.rmdir()


def fill(mount: Path) -> Path:
    """Take every free byte of the file system; returns the file that holds them."""
    filler = mount / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb", buffering=0) as out:
        try:
            while True:
                out.write(chunk)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
        with contextlib.suppress(OSError):
            while True:
                out.write(b"\0" * 4096)
    return filler


@pytest.fixture(params=["postgresql", "mysql"])
def full_disk_app(request: pytest.FixtureRequest) -> Iterator[tuple[Celery, Callable[[], None]]]:
    """The acceptance app on a private server whose disk is full; and how to free it."""
    with small_tmpfs(256) as mount:
        if request.param == "postgresql":
            server = start_private_postgres(root=mount)
            url, destroy = server.url, server.destroy
        else:
            mariadb = PrivateMariaDB(root=mount)
            url, destroy = mariadb.url, mariadb.destroy
            try:
                mariadb.start(wait_until)
            except BaseException:
                destroy()
                raise
        app = None
        try:
            app = next(_app_on(url))
            app.conf.task_publish_retry_policy = {"max_retries": 1, "interval_start": 0}
            filler = fill(mount)
            yield app, filler.unlink
        finally:
            engine_for(url).dispose()
            if app is not None:
                ratchet_state(app).reset()
            destroy()


def test_a_send_the_full_disk_refused_says_so_and_wrote_nothing(
    full_disk_app: tuple[Celery, Callable[[], None]],
) -> None:
    app, free_space = full_disk_app
    double = app.tasks["acc.double"]
    store = ratchet_state(app).store
    with pytest.raises(StoreUnavailable) as raised:
        # Enough rows for a table to need more room than its pages have left.
        for n in range(10_000):
            double.delay(n)
    error = raised.value
    assert isinstance(error, StoreFull), repr(error)
    assert error.outcome_unknown is False
    message = str(error)
    assert "may have been committed" not in message
    assert "no space left" in message and "nothing of it was written" in message
    sent = store.count_by_status().get("PENDING", 0)
    print(f"\n[{store.family}, disk full after {sent} sends] {message}")
    free_space()
    assert double.delay(-1) is not None
    assert store.count_by_status() == {"PENDING": sent + 1}
