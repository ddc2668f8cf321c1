"""Install smoke for the dashboard: the installed wheel (not this checkout) renders its pages
from the templates and static files it ships, and is served by waitress when the web extra
is installed; without the extra, `ratchet web` exits 2 naming it. /metrics answers with the
metrics extra, and names it (501) without.

    python .ci/smoke_web.py with-extra | bare
"""

from __future__ import annotations

import io
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def _get(app: Any, path: str) -> tuple[str, bytes]:
    got: dict[str, str] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        got["status"] = status

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "QUERY_STRING": "",
               "HTTP_HOST": "127.0.0.1", "wsgi.input": io.BytesIO(b"")}  # fmt: skip
    body = b"".join(app(environ, start_response))
    return got["status"], body


def main() -> None:
    url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'web.db'}"
    if sys.argv[1] == "bare":
        done = subprocess.run(
            [sys.executable, "-m", "celery_ratchet.cli.main", "--url", url, "web"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2 and "celery-ratchet[web]" in done.stderr, done
        print("    ratchet web without the web extra: exit 2, names the extra: ok")
        return
    import waitress  # noqa: F401  (the extra brings it)

    from celery_ratchet.store.jobstore import JobStore
    from celery_ratchet.web.app import Dashboard

    store = JobStore(url)
    store.ensure_schema()
    app = Dashboard(store)
    for path in ("/", "/jobs", "/tasks", "/queues", "/nodes", "/static/dashboard.js"):
        status, body = _get(app, path)
        assert status.startswith("200"), (path, status, body[-400:])
    print("    the dashboard's pages and static files from the installed wheel: ok")
    status, body = _get(app, "/metrics")
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError:
        assert status.startswith("501") and b"celery-ratchet[metrics]" in body, (status, body)
        print("    /metrics without the metrics extra: 501, names the extra: ok")
        return
    assert status.startswith("200"), (status, body[-400:])
    names = {f.name for f in text_string_to_metric_families(body.decode())}
    assert {"ratchet_jobs", "ratchet_recent_job_run_seconds"} <= names, names
    print("    /metrics with the metrics extra, read by prometheus_client's parser: ok")


if __name__ == "__main__":
    main()
