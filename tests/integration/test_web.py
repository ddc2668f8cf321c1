"""The dashboard as a WSGI application, called in-process: every page, each action, the CSRF
refusal, auth, read-only mode and escaping of what the database holds."""

from __future__ import annotations

import base64
import html
import io
import json
import logging
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urljoin, urlsplit

import pytest
from click.testing import CliRunner
from sqlalchemy import text

from celery_ratchet.cli.main import cli
from celery_ratchet.domain.batch import BatchKind, NewBatch
from celery_ratchet.domain.job import JobStatus, JobType, Message, Settlement
from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.runtime import recurring
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.inspection import Inspection
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.web.app import Dashboard
from celery_ratchet.web.guard import HostAllowlist
from celery_ratchet.web.server import make, serve
from tests.conftest import empty_store
from tests.helpers import new_job, wait_until

ROOT = Path(__file__).resolve().parents[2]
HOSTILE = "<script>alert('x')</script>"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: str


def call(
    app: Dashboard,
    path: str,
    *,
    method: str = "GET",
    form: dict[str, str] | list[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    script_name: str = "",
) -> Answer:
    path, _, query = path.partition("?")
    data = urlencode(form or {}).encode()
    environ: dict[str, Any] = {
        "SCRIPT_NAME": script_name,
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "HTTP_HOST": "127.0.0.1:5580",
        "SERVER_NAME": "localhost",
        "CONTENT_LENGTH": str(len(data)),
        "wsgi.input": io.BytesIO(data),
    }
    for name, value in (headers or {}).items():
        environ["HTTP_" + name.upper().replace("-", "_")] = value
    got: dict[str, Any] = {}

    def start_response(status: str, response_headers: list[tuple[str, str]]) -> None:
        got["status"] = int(status.split()[0])
        got["headers"] = dict(response_headers)

    body = b"".join(app(environ, start_response)).decode()
    return Answer(got["status"], got["headers"], body)


def post(app: Dashboard, path: str, **form: str) -> Answer:
    return call(app, path, method="POST", form={"csrf": app.guard.csrf_token, **form})


def hostile_message() -> Message:
    body = json.dumps([[HOSTILE], {"note": HOSTILE}, {}]).encode()
    headers = {"id": "bad-1", "task": "tests.fail", "retries": 0}
    return Message(body, "application/json", "utf-8", json.dumps(headers), "{}")


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return seeded(f"sqlite:///{tmp_path / 'web.db'}")


def seeded(url: str) -> JobStore:
    """A store on ``url`` holding a job of each kind the pages show: finished, failed (with
    hostile text), pending, a batch's child, one holding a permit; a schedule and a node."""
    store = empty_store(url)
    store.enqueue_many(
        [
            new_job("ok-1"),
            replace(new_job("bad-1", task="tests.fail"), message=hostile_message()),
            new_job("waiting", queue="slow"),
            replace(new_job("child-1"), group_id="batch-1", job_type=JobType.BATCH_CHILD),
            new_job("pay-1", resource="payments"),
        ]
    )
    claimed = {j.job_id: j for j in store.claim("node-1", ["celery"], 10)}
    store.claim_for_resource("node-1", ["celery"], "payments", 2, 10)
    store.settle(
        [
            Settlement("ok-1", claimed["ok-1"].token, JobStatus.SUCCEEDED),
            Settlement(
                "bad-1",
                claimed["bad-1"].token,
                JobStatus.FAILED,
                error=json.dumps({"exc_type": "ValueError", "exc_message": [HOSTILE]}),
                traceback=f"Traceback: {HOSTILE}",
            ),
        ]
    )
    store.add_log("ok-1", "INFO", "hello from the task")
    BatchStore(store).open(NewBatch("batch-1", BatchKind.GROUP, None, name=HOSTILE))
    recurring.register(
        store,
        "nightly",
        MasterSpec("cron:0 0 3 * * ?", "Europe/Berlin"),
        task_name="tests.tick",
        priority=4,
        message=new_job("t").message,
    )
    store.register_node("node-1", "host-a", 4242, ["celery"], 4)
    return store


def test_every_page_answers_and_shows_what_the_store_holds(store: JobStore) -> None:
    app = Dashboard(store)
    overview = call(app, "/")
    assert overview.status == 200
    assert "<svg" in overview.body and "1 min ago: 2" in overview.body
    assert re.search(r">failed</a></td><td>1<", overview.body, re.IGNORECASE)
    jobs = call(app, "/jobs?status=FAILED")
    assert "bad-1" in jobs.body and "ok-1" not in jobs.body
    job = call(app, "/job?id=ok-1")
    assert "hello from the task" in job.body and "batch" not in job.body.split("<h1>")[1][:10]
    child = call(app, "/job?id=child-1").body
    assert "batch-1" in child and "BATCH_CHILD (BATCH)" in child  # the seeds' types
    assert "<td>BATCH_CHILD</td>" in call(app, "/jobs").body
    dlq = call(app, "/dlq")
    assert "bad-1" in dlq.body and "ValueError" in dlq.body
    schedules = call(app, "/schedules")
    assert "nightly" in schedules.body and "Europe/Berlin" in schedules.body
    assert len(re.findall(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", schedules.body)) >= 5
    batches = call(app, "/batches")
    assert "batch-1" in batches.body and 'role="progressbar"' in batches.body
    batch = call(app, "/batch?id=batch-1")
    assert "<td>RUNNING</td><td>1</td>" in batch.body
    resources = call(app, "/resources")
    assert "payments" in resources.body and "pay-1" in resources.body
    nodes = call(app, "/nodes")
    assert "host-a" in nodes.body and "4242" in nodes.body
    assert call(app, "/job?id=nobody").status == 404
    assert call(app, "/jobs?status=nonsense").status == 400


def test_a_search_the_database_cannot_hold_is_a_400_not_a_store_error(
    server_store: JobStore, server_dialect: str, caplog: pytest.LogCaptureFixture
) -> None:
    # PostgreSQL refuses a NUL in text: the request's value, not the store, is at fault.
    # MariaDB takes it and finds nothing.
    with caplog.at_level(logging.WARNING, logger="celery_ratchet"):
        answer = call(Dashboard(server_store), "/jobs?q=%00")
    if server_dialect == "postgresql":
        assert answer.status == 400 and "NUL" in answer.body, answer.body
    else:
        assert answer.status == 200, answer.body
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_keyset_pages_of_the_jobs_list(store: JobStore) -> None:
    store.enqueue_many([new_job(f"many-{i:03}") for i in range(120)])
    app = Dashboard(store)
    first = call(app, "/jobs")
    older = re.search(r'href="(/jobs\?before=[^"]+)"', first.body)
    assert older is not None and "many-119" in first.body
    second = call(app, older.group(1).replace("&amp;", "&"))
    assert "many-069" in second.body and "many-119" not in second.body


def test_what_the_database_holds_is_shown_as_text_never_as_markup(store: JobStore) -> None:
    app = Dashboard(store)
    for path in ("/job?id=bad-1", "/dlq", "/batches", "/batch?id=batch-1", "/jobs"):
        answer = call(app, path)
        assert HOSTILE not in answer.body, path
        assert answer.body.count("<script") == 1, path  # the dashboard's own file only
        assert '<script src="/static/dashboard.js?v=' in answer.body, path
    assert "&lt;script&gt;" in call(app, "/job?id=bad-1").body
    policy = call(app, "/").headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe" not in policy


def test_an_action_without_the_csrf_token_is_refused(store: JobStore) -> None:
    app = Dashboard(store)
    refused = call(app, "/dlq/retry", method="POST", form={"job_id": "bad-1"})
    assert refused.status == 403
    wrong = call(app, "/dlq/retry", method="POST", form={"job_id": "bad-1", "csrf": "guess"})
    assert wrong.status == 403
    assert store.result("bad-1").status is JobStatus.FAILED  # type: ignore[union-attr]
    assert call(app, "/dlq/retry?job_id=bad-1").status == 404  # no action by GET


def test_retry_from_the_dead_letters_requeues_the_job(store: JobStore) -> None:
    app = Dashboard(store)
    assert f'name="csrf" value="{app.guard.csrf_token}"' in call(app, "/dlq").body
    done = post(app, "/dlq/retry", job_id="bad-1")
    assert done.status == 303 and done.headers["Location"].startswith("/dlq?note=requeued+1")
    assert store.result("bad-1").status is JobStatus.PENDING  # type: ignore[union-attr]


def test_purge_and_retry_all_of_a_task_ask_first(store: JobStore) -> None:
    app = Dashboard(store)
    asked = post(app, "/dlq/retry-task", task="tests.fail")
    assert asked.status == 200 and 'name="confirmed" value="yes"' in asked.body
    assert store.result("bad-1").status is JobStatus.FAILED  # type: ignore[union-attr]
    assert post(app, "/dlq/purge", job_id="bad-1").status == 200
    assert store.result("bad-1") is not None
    assert post(app, "/dlq/purge", job_id="bad-1", confirmed="yes").status == 303
    assert store.result("bad-1") is None


def test_a_schedule_is_paused_resumed_and_removed_from_the_page(store: JobStore) -> None:
    app = Dashboard(store)

    def status() -> str:
        [master] = [m for m in store.list_masters(include_cancelled=True)]
        return str(master["status"])

    assert post(app, "/schedules/pause", key="nightly").status == 303
    assert status() == JobStatus.PAUSED.value
    assert ">resume<" in call(app, "/schedules").body
    assert post(app, "/schedules/pause", key="nightly").status == 409
    assert post(app, "/schedules/resume", key="nightly").status == 303
    assert status() == JobStatus.PENDING.value
    assert post(app, "/schedules/remove", key="nightly").status == 200  # asks first
    assert post(app, "/schedules/remove", key="nightly", confirmed="yes").status == 303
    assert status() == JobStatus.REVOKED.value


def test_read_only_shows_no_action_and_refuses_them(store: JobStore) -> None:
    app = Dashboard(store, read_only=True)
    page = call(app, "/dlq").body
    assert "bad-1" in page and 'method="post"' not in page
    assert 'method="post"' not in call(app, "/jobs").body
    assert post(app, "/dlq/retry", job_id="bad-1").status == 403
    assert store.result("bad-1").status is JobStatus.FAILED  # type: ignore[union-attr]


@pytest.mark.parametrize("auth", ["admin:s3cret", "a-token-of-ours"])
def test_with_auth_on_anonymous_gets_401(store: JobStore, auth: str) -> None:
    app = Dashboard(store, auth=auth)
    anonymous = call(app, "/")
    assert anonymous.status == 401 and "Basic" in anonymous.headers["WWW-Authenticate"]
    user = auth if ":" in auth else f"any:{auth}"
    basic = "Basic " + base64.b64encode(user.encode()).decode()
    assert call(app, "/", headers={"Authorization": basic}).status == 200
    wrong = "Basic " + base64.b64encode(b"admin:wrong").decode()
    assert call(app, "/", headers={"Authorization": wrong}).status == 401
    if ":" not in auth:
        assert call(app, "/", headers={"Authorization": f"Bearer {auth}"}).status == 200


def test_without_auth_another_sites_host_name_is_refused(store: JobStore) -> None:
    app = Dashboard(store)
    assert call(app, "/", headers={"Host": "evil.example:5580"}).status == 403
    assert call(app, "/", headers={"Host": "localhost:5580"}).status == 200
    assert call(app, "/", headers={"Host": "[::1]:5580"}).status == 200
    served_on_purpose = Dashboard(store, hosts=HostAllowlist.for_bind("10.1.2.3"))
    assert call(served_on_purpose, "/", headers={"Host": "10.1.2.3:5580"}).status == 200


def test_a_non_loopback_host_without_auth_is_refused_with_exit_2(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'web.db'}"
    empty_store(url)
    result = CliRunner().invoke(cli, ["--url", url, "web", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "RATCHET_WEB_AUTH" in result.output and "--insecure-no-auth" in result.output


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_ratchet_web_serves_over_http_and_refuses_a_post_without_its_token(store: JobStore) -> None:
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "celery_ratchet.cli.main", "--url", store.url, "web",
         "--port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:

        def answers() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/dlq", timeout=5) as got:
                    return got.status == 200 and b"bad-1" in got.read()
            except (urllib.error.URLError, ConnectionError):
                return False

        wait_until(answers, 30, "ratchet web to answer")
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/dlq/retry", data=b"job_id=bad-1", method="POST"
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        refused.value.close()  # the error holds the response's socket
        assert refused.value.code == 403
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0].decode()
    assert f"http://127.0.0.1:{port}/" in output


def test_a_schedule_shows_its_last_fire_from_the_occurrence_the_store_holds(
    store: JobStore,
) -> None:
    recurring.register(
        store,
        "hourly",
        MasterSpec("cron:0 0 * * * ?", "UTC"),
        task_name="tests.tick",
        priority=4,
        message=new_job("t").message,
    )
    [master] = [m for m in store.list_masters() if m["business_key"] == "hourly"]
    fired = master["scheduled_time"] - timedelta(hours=1)
    occurrence = recurring.occurrence_id(master["job_id"], fired)
    store.enqueue(new_job(occurrence))
    page = call(Dashboard(store), "/schedules").body
    row = next(r for r in page.split("<tr>") if "hourly" in r)
    assert occurrence.replace("+", "%2B").replace(":", "%3A").replace("@", "%40") in row
    assert "PENDING" in row
    nightly = next(r for r in page.split("<tr>") if "nightly" in r)
    assert "—" in nightly


def test_an_unreachable_store_is_a_503_with_the_password_masked() -> None:
    unreachable = JobStore("postgresql://ops:hunter2@127.0.0.1:1/shop", create_schema=False)
    answer = call(Dashboard(unreachable), "/")
    assert answer.status == 503
    assert "hunter2" not in answer.body and "127.0.0.1" in answer.body


def test_an_action_acts_on_the_value_exactly_as_sent_never_stripped(store: JobStore) -> None:
    recurring.register(
        store,
        "nightly ",
        MasterSpec("cron:0 0 4 * * ?", "UTC"),
        task_name="tests.tick",
        priority=4,
        message=new_job("t2").message,
    )
    app = Dashboard(store)
    assert post(app, "/schedules/remove", key="nightly ", confirmed="yes").status == 303
    assert [m["business_key"] for m in store.list_masters()] == ["nightly"]
    assert "requeued+0+jobs" in post(app, "/dlq/retry", job_id=" bad-1").headers["Location"]
    assert post(app, "/dlq/purge", job_id="bad-1 ", confirmed="yes").status == 303
    assert post(app, "/dlq/retry-task", task="tests.fail ", confirmed="yes").status == 303
    assert store.result("bad-1").status is JobStatus.FAILED  # type: ignore[union-attr]
    assert "bad-1" not in call(app, "/dlq?task=tests.fail%20").body
    assert call(app, "/job?id=%20ok-1").status == 404


@pytest.mark.parametrize(
    ("corruption", "path", "shown"),
    [
        ("UPDATE scheduler_batch SET kind = 'WEIRD'", "/batches", "UNKNOWN(WEIRD)"),
        ("UPDATE scheduler_batch SET kind = 'WEIRD'", "/batch?id=batch-1", "UNKNOWN(WEIRD)"),
        ("UPDATE scheduler_batch SET state = 'ODD'", "/batches", "UNKNOWN(ODD)"),
        ("UPDATE scheduler_job SET finished_at = 'garbage' WHERE job_id = 'ok-1'", "/jobs",
         "<td>unreadable</td>"),
        ("UPDATE scheduler_node SET heartbeat_ts = 'garbage'", "/nodes", "<td>unreadable</td>"),
        ("""UPDATE scheduler_job SET schedule_spec = '{"schedule":"cron:bogus"}'
            WHERE business_key = 'nightly'""", "/schedules", "<td>unreadable</td>"),
        ("UPDATE scheduler_job SET schedule_spec = '{}' WHERE business_key = 'nightly'",
         "/schedules", "<td>unreadable</td>"),
    ],
)  # fmt: skip
def test_one_corrupt_row_shows_as_unreadable_and_the_page_still_answers(
    store: JobStore, corruption: str, path: str, shown: str, caplog: pytest.LogCaptureFixture
) -> None:
    with store.engine.begin() as conn:
        conn.execute(text(corruption))
    answer = call(Dashboard(store), path)
    assert answer.status == 200, answer.body
    assert shown in answer.body
    assert "garbage" not in answer.body and "bogus" not in answer.body
    assert all("bogus" not in r.getMessage() for r in caplog.records)
    if path == "/jobs":
        assert "bad-1" in answer.body  # the other rows as stored


def test_an_unexpected_failure_is_a_500_page_of_ours_logged_once_without_its_message(
    store: JobStore, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("row contents: s3cret")

    monkeypatch.setattr(BatchStore, "summaries", broken)
    for path in ("/batches", "/batch?id=batch-1"):
        caplog.clear()
        answer = call(Dashboard(store), path)
        assert answer.status == 500
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert "default-src 'none'" in answer.headers["Content-Security-Policy"]
        assert "s3cret" not in answer.body and "Traceback" not in answer.body
        errors = [r for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "KeyError" in errors[0].getMessage()
        assert "s3cret" not in errors[0].getMessage() and errors[0].exc_info is None
    monkeypatch.setattr(JobStore, "list_jobs", lambda *a, **k: (_ for _ in ()).throw(ValueError))
    assert call(Dashboard(store), "/jobs").status == 500  # a ValueError of ours is no 400


def test_a_non_loopback_bind_answers_only_its_own_and_the_allowed_names(store: JobStore) -> None:
    hosts = HostAllowlist.for_bind("10.1.2.3", ["ratchet.internal"])
    app = Dashboard(store, hosts=hosts)  # as --insecure-no-auth serves it: no credentials
    assert call(app, "/", headers={"Host": "evil.com"}).status == 403
    assert call(app, "/", headers={"Host": "127.0.0.1:5580"}).status == 403
    assert call(app, "/", headers={"Host": "10.1.2.3:5580"}).status == 200
    assert call(app, "/", headers={"Host": "RATCHET.internal:5580"}).status == 200
    with_auth = Dashboard(store, auth="a-token", hosts=hosts)
    bearer = {"Authorization": "Bearer a-token"}
    assert call(with_auth, "/", headers={**bearer, "Host": "evil.com"}).status == 403
    everywhere = HostAllowlist.for_bind("0.0.0.0")
    assert everywhere.admits(socket.gethostname()) and not everywhere.admits("evil.com")


def test_the_cli_passes_allowed_hosts_and_shows_an_ipv6_host_once_bracketed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: dict[str, Any] = {}

    class Stopped:
        port = 5999
        kind = "a stand-in"

        def serve(self) -> None:
            raise KeyboardInterrupt

        def close(self) -> None:
            pass

    def fake_serve(host: str, port: int, app: Dashboard) -> Stopped:
        made["app"] = app
        return Stopped()

    monkeypatch.setattr("celery_ratchet.web.server.serve", fake_serve)
    url = f"sqlite:///{tmp_path / 'web.db'}"
    empty_store(url)
    args = ["--url", url, "web", "--host", "[::1]", "--allowed-host", "box.lan"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "http://[::1]:5999/" in result.output
    assert made["app"].hosts.admits("box.lan") and made["app"].hosts.admits("localhost")
    assert not made["app"].hosts.admits("evil.com")


def test_the_request_handler_has_a_socket_timeout() -> None:
    server = make("127.0.0.1", 0, Dashboard(empty_store("sqlite://")))
    try:
        assert server.RequestHandlerClass.timeout is not None
        assert 0 < server.RequestHandlerClass.timeout <= 60
    finally:
        server.server_close()


def test_only_a_note_this_process_signed_is_shown(store: JobStore) -> None:
    app = Dashboard(store)
    assert "call 555-0100" not in call(app, "/?note=call+555-0100+for+support").body
    done = post(app, "/dlq/retry", job_id="bad-1")
    location = done.headers["Location"]
    assert "requeued 1 job" in call(app, location).body
    note = parse_qs(location.partition("?")[2])["note"][0]
    forged = urlencode({"note": note + " and call 555-0100", "sig": "0" * 64})
    assert "555-0100" not in call(app, f"/dlq?{forged}").body


def test_an_unknown_page_cursor_is_a_400_naming_it(store: JobStore) -> None:
    answer = call(Dashboard(store), "/jobs?before=archived-long-ago")
    assert answer.status == 400 and "before=" in answer.body


def test_head_sends_the_headers_without_the_body(store: JobStore) -> None:
    app = Dashboard(store)
    head = call(app, "/dlq", method="HEAD")
    assert head.status == 200 and head.body == ""
    assert int(head.headers["Content-Length"]) == len(call(app, "/dlq").body.encode())


def test_an_error_page_shows_the_read_only_badge_only_in_read_only_mode(store: JobStore) -> None:
    assert "read-only</span>" not in call(Dashboard(store), "/job?id=nobody").body
    assert "read-only</span>" in call(Dashboard(store, read_only=True), "/job?id=nobody").body


def test_settings_repr_hides_the_web_credentials_and_masks_url_passwords() -> None:
    settings = RatchetSettings(url="postgresql://ops:hunter2@db/shop", web_auth="ops:s3cret")
    shown = repr(settings)
    assert "s3cret" not in shown and "hunter2" not in shown and "db/shop" in shown


def _rows(body: str) -> list[str]:
    """The job ids of a jobs list, in order."""
    return [unquote(i) for i in re.findall(r'<td><a href="/job\?id=([^"]+)">', body)]


def test_a_search_names_a_job_or_finds_task_names_holding_the_text(store: JobStore) -> None:
    app = Dashboard(store)
    found = call(app, "/jobs?q=ok-1")
    assert found.status == 303 and found.headers["Location"] == "/job?id=ok-1"
    assert _rows(call(app, "/jobs?q=FAIL").body) == ["bad-1"]
    assert _rows(call(app, "/jobs?q=nothing-like-it").body) == []


def test_recurring_ticks_are_hidden_until_asked_for(store: JobStore) -> None:
    tick = "recurring:nightly@2026-01-01T03:00:00+00:00"
    store.enqueue_many([new_job(tick, task="tests.tick")])
    app = Dashboard(store)
    assert tick not in _rows(call(app, "/jobs").body)
    assert tick in _rows(call(app, "/jobs?ticks=1").body)


def test_the_creation_time_filters(store: JobStore) -> None:
    app = Dashboard(store)
    assert "ok-1" in _rows(call(app, "/jobs?range=15m").body)
    assert _rows(call(app, "/jobs?since=2999-01-01T00:00").body) == []
    assert _rows(call(app, "/jobs?until=2000-01-01T00:00").body) == []
    assert "ok-1" in _rows(call(app, "/jobs?since=2000-01-01T00:00&until=2999-01-01").body)
    bad = call(app, "/jobs?since=yesterday")
    assert bad.status == 400 and "since=" in bad.body
    assert call(app, "/jobs?range=forever").status == 400


def test_wait_and_run_columns_and_the_job_page_timings(store: JobStore) -> None:
    app = Dashboard(store)
    jobs = call(app, "/jobs").body
    assert "<th>wait</th><th>run</th>" in jobs
    assert re.search(r'<td class="num">\d+\.\d\d s</td>', jobs)
    page = call(app, "/job?id=ok-1").body
    assert re.search(r"run \(start → end\)</th><td>\d+\.\d\d s<", page)


def test_an_error_is_its_type_and_message_and_the_traceback_its_frames(store: JobStore) -> None:
    job_id = "tb-1"
    store.enqueue_many([new_job(job_id, queue="tb")])
    [claimed] = store.claim("node-1", ["tb"], 1)
    traceback = (
        "Traceback (most recent call last):\n"
        '  File "/srv/venv/lib/python3.12/site-packages/celery/app/trace.py", line 453, in trace\n'
        "    R = retval = fun(*args, **kwargs)\n"
        '  File "/srv/shop/tasks.py", line 12, in charge\n'
        "    raise ValueError(f'card {card} declined')\n"
        "ValueError: card 42 declined\n"
    )
    store.settle(
        [
            Settlement(
                job_id,
                claimed.token,
                JobStatus.FAILED,
                error=json.dumps({"exc_type": "ValueError", "exc_message": ["card 42 declined"],
                                  "exc_module": "builtins"}),
                traceback=traceback,
            )
        ]
    )  # fmt: skip
    page = call(Dashboard(store), f"/job?id={job_id}").body
    assert "<b>ValueError</b>: card 42 declined" in page
    assert "exc_type" not in page.split("<details>")[0]  # not the stored JSON
    assert re.search(r'class="frame app"><span class="where">/srv/shop/tasks.py:12</span>', page)
    assert 'class="frame lib"' in page
    assert "<b>ValueError</b>: card 42 declined" in call(Dashboard(store), "/dlq").body


def test_cancel_and_terminate_ask_first_then_revoke_pending_and_mark_running(
    store: JobStore,
) -> None:
    store.enqueue_many([new_job("p-1"), new_job("p-2"), new_job("r-1", queue="run")])
    [running] = store.claim("node-1", ["run"], 1)
    app = Dashboard(store)
    asked = call(app, "/jobs/cancel", method="POST",
                 form={"csrf": app.guard.csrf_token, "job_id": "p-1"})  # fmt: skip
    assert asked.status == 200 and "cancel p-1?" in asked.body
    assert store.result("p-1").status is JobStatus.PENDING  # type: ignore[union-attr]
    form = [
        ("csrf", app.guard.csrf_token),
        ("job_id", "p-1"),
        ("job_id", "p-2"),
        ("job_id", "ok-1"),
        ("confirmed", "yes"),
        ("back", "/jobs?status=PENDING"),
    ]
    done = call(app, "/jobs/cancel", method="POST", form=form)
    assert done.status == 303
    assert done.headers["Location"].startswith("/jobs?status=PENDING&note=cancelled")
    assert "1+already+finished" in done.headers["Location"]
    for job_id in ("p-1", "p-2"):
        assert store.result(job_id).status is JobStatus.REVOKED  # type: ignore[union-attr]
    assert post(app, "/jobs/terminate", job_id="r-1", confirmed="yes").status == 303
    assert store.revocations("node-1") == [("r-1", running.token, "SIGTERM")]
    assert post(app, "/jobs/cancel").status == 400  # no job ticked


def test_run_now_makes_the_schedule_due(store: JobStore) -> None:
    app = Dashboard(store)
    assert ">run now<" in call(app, "/schedules").body
    done = post(app, "/schedules/run", key="nightly")
    assert done.status == 303 and "due+now" in done.headers["Location"]
    [master] = store.list_masters()
    assert master["scheduled_time"] <= Inspection(store).database_now()
    assert post(app, "/schedules/run", key="nobody").status == 409


def test_the_queues_page_and_its_purge(store: JobStore) -> None:
    app = Dashboard(store)
    page = call(app, "/queues").body
    assert "slow" in page and "host-a" in page  # node-1 consumes celery
    assert post(app, "/queues/purge", queue="slow").status == 200  # asks first
    assert post(app, "/queues/purge", queue="slow", confirmed="yes").status == 303
    assert store.result("waiting") is None


def test_a_queue_is_paused_and_resumed_from_the_queues_page(store: JobStore) -> None:
    app = Dashboard(store)
    assert ">pause<" in call(app, "/queues").body
    asked = post(app, "/queues/pause", queue="slow", reason="<b>relay</b> down")
    assert asked.status == 200 and "pause queue slow" in asked.body  # asks first
    # ... with the reason to fill in there, as the command's --reason
    assert 'name="reason" value="&lt;b&gt;relay&lt;/b&gt; down"' in asked.body
    unasked = post(app, "/queues/pause", queue="slow")
    assert '<input type="text" name="reason" value=""' in unasked.body
    assert store.paused_queues() == {}
    done = post(app, "/queues/pause", queue="slow", reason="<b>relay</b> down", confirmed="yes")
    assert done.status == 303 and store.paused_queues()["slow"].reason == "<b>relay</b> down"
    page = call(app, "/queues").body
    assert "&lt;b&gt;relay&lt;/b&gt; down" in page and ">resume<" in page
    assert post(app, "/queues/pause", queue="x" * 300, confirmed="yes").status == 400
    assert post(app, "/queues/resume", queue="slow").status == 303  # resuming asks nothing
    assert store.paused_queues() == {}


def test_the_tasks_pages_chart_what_ended(store: JobStore) -> None:
    app = Dashboard(store)
    tasks = call(app, "/tasks").body
    assert "tests.fail" in tasks and "100.0 %" in tasks
    page = call(app, "/task?name=tests.add&window=1h").body
    assert page.count("<svg") == 3
    assert 'data-succeeded="1"' in page
    assert call(app, "/task?name=tests.add&window=1y").status == 400


def test_worker_commands_without_a_worker_say_none_answered(store: JobStore) -> None:
    app = Dashboard(store)
    app.workers.timeout = 0.1
    page = call(app, "/node?id=node-1").body
    assert "did not answer" in page and ">grow pool<" in page
    done = post(app, "/nodes/pool-grow", node="w1@host-a", node_id="node-1", n="2")
    assert done.status == 303 and "no+worker+answered" in done.headers["Location"]
    assert done.headers["Location"].startswith("/node?id=node-1&")
    assert post(app, "/nodes/pool-grow", node="w1@host-a", n="many").status == 400
    assert post(app, "/tasks/rate-limit", task="tests.add", rate="lots").status == 400
    assert post(app, "/nodes/shutdown", node="w1@host-a").status == 200  # asks first
    assert call(app, "/node?id=nobody").status == 404


def test_mounted_under_a_prefix_every_link_and_redirect_keeps_it(store: JobStore) -> None:
    app = Dashboard(store)
    page = call(app, "/jobs", script_name="/ops/ratchet")
    links = re.findall(r'(?:href|action|src)="([^"]+)"', page.body)
    assert links and all(link.startswith("/ops/ratchet/") for link in links), links
    moved = call(app, "/jobs?q=ok-1", script_name="/ops/ratchet")
    assert moved.headers["Location"] == "/ops/ratchet/job?id=ok-1"


def test_static_files_are_served_with_their_types(store: JobStore) -> None:
    app = Dashboard(store)
    script = call(app, "/static/dashboard.js")
    assert script.status == 200 and script.headers["Content-Type"].startswith("text/javascript")
    assert "data-live" in script.body
    assert call(app, "/static/dashboard.css").headers["Content-Type"].startswith("text/css")
    assert call(app, "/static/../app.py").status == 404


def _app(environ: object, start_response: object) -> list[bytes]:
    return []


def test_waitress_serves_when_installed_and_the_standard_library_when_asked() -> None:
    for prefer_stdlib, kind in ((False, "waitress"), (True, "the standard library")):
        server = serve("127.0.0.1", 0, _app, prefer_stdlib=prefer_stdlib)
        try:
            assert server.kind.startswith(kind) and server.port > 0
        finally:
            server.close()


#: ``back=`` values that would send a browser elsewhere: another site (a browser reads ``\\``
#: as ``/`` and drops tabs and newlines), a scheme, or a path out of the dashboard's prefix.
ELSEWHERE = [
    "/\\evil.com",
    "//evil.com",
    "https://evil.com",
    "\\\\evil.com",
    "/%5Cevil.com",
    "/%2F%2Fevil.com",
    "/\t/evil.com",
    "/\n/evil.com",
    "javascript:alert(1)",
    "/../elsewhere",
    "/jobs/../../elsewhere",
    "/no-such-page",
]


def _lands(location: str, base: str) -> str:
    """Where a browser on the dashboard goes for ``location``: the path, once it is sure
    the host is the dashboard's."""
    seen = re.sub(r"[\t\n\r]", "", location).replace("\\", "/")
    landed = urlsplit(urljoin(f"http://127.0.0.1:5580{base}/jobs", seen))
    assert (landed.scheme, landed.netloc) == ("http", "127.0.0.1:5580"), location
    assert "%5c" not in landed.path.lower() and "%2f" not in landed.path.lower(), location
    assert landed.path.startswith(f"{base}/") and "/../" not in f"{landed.path}/", location
    return landed.path[len(base) :]


@pytest.mark.parametrize("base", ["", "/ops/ratchet"])
@pytest.mark.parametrize("back", ELSEWHERE)
def test_a_back_value_leaving_the_dashboard_goes_to_the_pages_default(
    store: JobStore, back: str, base: str
) -> None:
    store.enqueue_many([new_job("p-1"), new_job("p-2")])
    app = Dashboard(store)

    def act(path: str, *form: tuple[str, str]) -> Answer:
        sent = [("csrf", app.guard.csrf_token), *form, ("back", back)]
        return call(app, path, method="POST", form=sent, script_name=base)

    asked = act("/jobs/cancel", ("job_id", "p-1"))
    [no] = re.findall(r'<a href="([^"]*)">no, go back</a>', asked.body)
    assert _lands(html.unescape(no), base) == "/job"
    cancelled = act("/jobs/cancel", ("job_id", "p-1"), ("job_id", "p-2"), ("confirmed", "yes"))
    assert cancelled.status == 303 and _lands(cancelled.headers["Location"], base) == "/jobs"
    retried = act("/dlq/retry", ("job_id", "bad-1"))
    assert retried.status == 303 and _lands(retried.headers["Location"], base) == "/dlq"
    purged = act("/dlq/purge", ("job_id", "bad-1"), ("confirmed", "yes"))
    assert purged.status == 303 and _lands(purged.headers["Location"], base) == "/dlq"


@pytest.mark.parametrize("base", ["", "/ops/ratchet"])
def test_a_back_value_of_a_dashboard_page_keeps_its_query(store: JobStore, base: str) -> None:
    app = Dashboard(store)
    sent = [("csrf", app.guard.csrf_token), ("job_id", "bad-1"), ("back", "/job?id=bad-1")]
    retried = call(app, "/dlq/retry", method="POST", form=sent, script_name=base)
    assert retried.status == 303
    assert retried.headers["Location"].startswith(f"{base}/job?id=bad-1&note=requeued")
