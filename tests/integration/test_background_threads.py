"""No thread celery_ratchet starts takes a signal meant for the process: the main thread does.

A billiard pool process blocks SIGTERM in its main thread while it writes its last message to
the pool's result pipe; a thread of ours that took the signal meanwhile killed the process with
the pipe's lock held, and the next pool process waited on that lock for good (a revoke with
terminate, then nothing ran on that worker). Here, as billiard does: SIGTERM at its default
action, blocked in the main thread, sent to the process."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SCRIPT = """
import os, signal, sys, threading
from celery_ratchet.threads import background_thread

started = threading.Event()
if sys.argv[1] == "store":
    # The store's statement keeper, as a pool process running a task that uses the store
    # starts it.
    from celery_ratchet.store.jobstore import JobStore
    store = JobStore(sys.argv[2])
    store.ensure_schema()
    store.node_heartbeats()
    names = [t.name for t in threading.enumerate()]
    assert "ratchet-statement-deadlines" in names, names
    started.set()
elif sys.argv[1] == "plain":
    threading.Thread(target=lambda: (started.set(), threading.Event().wait()), daemon=True).start()
else:
    background_thread(lambda: (started.set(), threading.Event().wait()), "t").start()
started.wait()
signal.signal(signal.SIGTERM, signal.SIG_DFL)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
os.kill(os.getpid(), signal.SIGTERM)
for _ in range(50):  # a thread taking the signal would have ended the process by now
    os.sched_yield()
    threading.Event().wait(0.002)
print("still here while SIGTERM is blocked", flush=True)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
print("not reached", flush=True)
"""


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "blocked_sigterm.py"
    script.write_text(textwrap.dedent(_SCRIPT))
    return subprocess.run(
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=60
    )


def test_a_plain_thread_takes_the_signal_the_main_thread_blocks(tmp_path: Path) -> None:
    """The hazard itself, so that the test below is known to be able to fail."""
    done = _run(tmp_path, "plain")
    assert done.returncode == -signal.SIGTERM
    assert "still here" not in done.stdout


def test_a_background_thread_leaves_the_signal_to_the_main_thread(tmp_path: Path) -> None:
    done = _run(tmp_path, "background")
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout.splitlines() == ["still here while SIGTERM is blocked"]


@pytest.mark.parametrize("dialect", ["postgresql", "mysql"], indirect=True)
def test_the_store_statement_keeper_leaves_the_signal_to_the_main_thread(
    tmp_path: Path, db_url: str
) -> None:
    done = _run(tmp_path, "store", db_url)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert done.stdout.splitlines() == ["still here while SIGTERM is blocked"]
