"""The operations CLI: ``ratchet --url`` in-process, ``celery -A app ratchet`` as a process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from celery_ratchet.cli.main import cli
from celery_ratchet.domain.batch import BatchKind, BatchPart, NewBatch
from celery_ratchet.domain.job import JobStatus, Settlement
from celery_ratchet.store.batches import BatchStore
from celery_ratchet.store.ddl import ddl_script
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import MYSQL_HOST, PG_HOST, Servers, _reachable, empty_store
from tests.helpers import new_job

ROOT = Path(__file__).resolve().parents[2]


def test_jobs_stats_and_schema(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    store = empty_store(url)
    store.enqueue(new_job("ok"))
    store.enqueue(new_job("bad", task="tests.fail"))
    claimed = {j.job_id: j for j in store.claim("node-1", ["celery"], 10)}
    store.settle(
        [
            Settlement(
                "bad", claimed["bad"].token, JobStatus.FAILED, error='{"exc_type": "ValueError"}'
            )
        ]
    )
    runner = CliRunner()

    listed = runner.invoke(cli, ["--url", url, "jobs", "--status", "failed", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [j["job_id"] for j in json.loads(listed.output)] == ["bad"]

    shown = runner.invoke(cli, ["--url", url, "jobs", "show", "bad"])
    assert "ValueError" in shown.output and "tests.fail" in shown.output

    stats = json.loads(runner.invoke(cli, ["--url", url, "stats", "--json"]).output)
    assert {(s["queue"], s["status"]): s["count"] for s in stats["counts"]} == {
        ("celery", "RUNNING"): 1, ("celery", "FAILED"): 1,
    }  # fmt: skip
    assert stats["finished_last_minute"] == 1 and stats["oldest_pending_seconds"] == {}
    table = runner.invoke(cli, ["--url", url, "stats"]).output
    assert "finished in the last minute: 1" in table and "OLDEST_DUE_S" in table

    assert runner.invoke(cli, ["--url", url, "schema", "check"]).output.strip() == (
        "schema matches"
    )
    shown_ddl = runner.invoke(cli, ["--url", url, "schema", "show"]).output
    assert shown_ddl == ddl_script("sqlite")
    missing = runner.invoke(cli, ["--url", url, "jobs", "show", "nope"])
    assert missing.exit_code == 2 and "no job 'nope'" in missing.output


def test_unreachable_store_is_a_clear_error_with_the_password_masked() -> None:
    result = CliRunner().invoke(cli, ["--url", "postgresql://u:hunter2@127.0.0.1:1/x", "stats"])
    assert result.exit_code != 0
    assert "cannot reach the job store" in result.output
    assert "hunter2" not in result.output


def test_celery_ratchet_command_runs_without_a_broker(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'celery-cli.db'}"
    empty_store(url).enqueue(new_job("queued"))
    env = {**os.environ, "RATCHET_URL": url, "PYTHONPATH": str(ROOT)}
    # tests.acceptance.app points broker_url at a closed port: contacting it would fail.
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.acceptance.app", "ratchet", "jobs", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert [j["job_id"] for j in json.loads(out.stdout)] == ["queued"]


def test_cron_next_prints_utc_and_local_times() -> None:
    runner = CliRunner()
    out = runner.invoke(
        cli,
        [
            "cron",
            "next",
            "0 0 2 * * ?",
            "--zone",
            "Europe/London",
            "--after",
            "2026-03-28T12:00:00+00:00",
            "-n",
            "2",
        ],
    )
    assert out.exit_code == 0, out.output
    assert out.output.splitlines() == [
        "2026-03-29T01:00:00+00:00  2026-03-29T02:00:00+01:00",
        "2026-03-30T01:00:00+00:00  2026-03-30T02:00:00+01:00",
    ]
    bad = runner.invoke(cli, ["cron", "next", "*/5 * * * *"])
    assert bad.exit_code == 2
    assert "did you mean '0 */5 * * * ?'" in bad.output
    never = runner.invoke(cli, ["cron", "next", "0 0 2 30 2 ?", "--after", "2026-01-01T00:00"])
    assert never.exit_code == 2
    assert "'0 0 2 30 2 ?' has no fire time after 2026-01-01T00:00:00+00:00" in never.output
    zone = runner.invoke(cli, ["cron", "next", "0 0 2 * * ?", "--zone", "Mars/Base"])
    assert zone.exit_code == 2
    assert "unknown time zone 'Mars/Base'" in zone.output and "invalid cron" not in zone.output


def test_dlq_list_show_retry_purge(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dlq.db'}"
    store = empty_store(url)
    store.enqueue_many([new_job(f"dead-{i}", task="tests.charge", attempts=3) for i in range(3)])
    error = '{"exc_type": "CardDeclined", "exc_message": ["no funds"], "exc_module": "shop"}'
    store.settle(
        [Settlement(j.job_id, j.token, JobStatus.FAILED, error=error, traceback="Traceback: x")
         for j in store.claim("n", ["celery"], 10)]
    )  # fmt: skip
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(cli, ["--url", url, "dlq", *args])
        assert result.exit_code == 0, result.output
        return result.output

    listed = json.loads(run("list", "--task", "tests.charge", "--json"))
    assert sorted(j["job_id"] for j in listed) == ["dead-0", "dead-1", "dead-2"]
    shown = json.loads(run("show", "dead-0", "--json"))
    assert (shown["args"], shown["attempts"], shown["exception"]) == (
        [1, 2], 3, "CardDeclined: no funds",
    )  # fmt: skip
    assert "Traceback: x" in run("show", "dead-0")
    assert run("retry", "dead-0").strip() == f"requeued 1 job on {url}"
    record = store.result("dead-0")
    assert record is not None and (record.status, record.attempts) == (JobStatus.PENDING, 0)
    assert '"retries": 0' in (record.headers or "")
    assert runner.invoke(cli, ["--url", url, "dlq", "retry"]).exit_code == 2  # nothing named
    assert run("purge", "--yes").strip() == f"deleted 2 failed jobs on {url}"
    assert json.loads(run("list", "--json")) == []
    missing = runner.invoke(cli, ["--url", url, "dlq", "show", "dead-0"])
    assert missing.exit_code == 2 and "no failed job" in missing.output


def test_dlq_list_shows_whether_the_alert_of_each_job_was_sent(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'alerts.db'}"
    empty_store(url)
    store = JobStore(url, dlq_alert_task="tests.on_dead_letters")

    def fail(job_id: str) -> None:
        store.enqueue(new_job(job_id, task="tests.charge"))
        [claimed] = store.claim("n", ["celery"], 1)
        store.settle([Settlement(job_id, claimed.token, JobStatus.FAILED, error="{}")])

    fail("sent-0")
    store.close_alert_window(
        "tests.charge",
        0,
        lambda w, ids, now: new_job("alert-1", task="tests.on_dead_letters", queue="alerts"),
    )
    fail("due-0")
    runner = CliRunner()
    listed = runner.invoke(cli, ["--url", url, "dlq", "list", "--task", "tests.charge", "--json"])
    assert listed.exit_code == 0, listed.output
    assert {j["job_id"]: j["alert"] for j in json.loads(listed.output)} == {
        "sent-0": "sent",
        "due-0": "due",
    }
    table = runner.invoke(cli, ["--url", url, "dlq", "list"]).output
    assert "ALERT" in table.splitlines()[0]


def _celery(*args: str, url: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery", *args],
        cwd=ROOT,
        env={**os.environ, "RATCHET_URL": url, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_import_beat_prints_quartz_forms_and_registers_each_entry(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'beat.db'}"
    store = empty_store(url)
    dry = _celery(
        "-A", "tests.integration.beat_app", "ratchet", "import-beat", "--dry-run", url=url
    )
    assert dry.returncode == 0, dry.stderr
    assert "nightly-report: would register beat.report cron:0 30 2 * * ?" in dry.stdout
    assert "heartbeat: would register beat.report every:900" in dry.stdout
    assert store.list_masters() == []
    done = _celery("-A", "tests.integration.beat_app", "ratchet", "import-beat", url=url)
    assert done.returncode == 0, done.stderr
    keys = {m["business_key"] for m in store.list_masters()}
    assert keys == {"nightly-report", "heartbeat"}
    bad = _celery(
        "-A", "tests.integration.beat_app", "ratchet", "import-beat", url=url, BEAT_APP_CUSTOM="1"
    )
    assert bad.returncode == 2
    assert "weekdays: NOT IMPORTED" in bad.stderr and "1 of 3" in bad.stderr
    without = ("-A", "tests.integration.beat_app", "ratchet", "import-beat")
    # Ahead of a deploy, a running worker of the release before still has it: it stays.
    store.register_node("running", "h", 1, ["celery"], 1, ["nightly-report", "heartbeat"])
    held = _celery(*without, url=url, BEAT_APP_WITHOUT="heartbeat")
    assert held.returncode == 0, held.stderr
    assert "heartbeat: kept: a running worker's beat_schedule has it" in held.stdout
    assert {m["business_key"] for m in store.list_masters()} == {"nightly-report", "heartbeat"}
    store.remove_node("running")
    dry_gone = _celery(*without, "--dry-run", url=url, BEAT_APP_WITHOUT="heartbeat")
    assert "heartbeat: would remove" in dry_gone.stdout, dry_gone.stderr
    assert {m["business_key"] for m in store.list_masters()} == {"nightly-report", "heartbeat"}
    gone = _celery(*without, url=url, BEAT_APP_WITHOUT="heartbeat")
    assert gone.returncode == 0, gone.stderr
    assert "heartbeat: removed (registered from beat_schedule" in gone.stdout
    assert {m["business_key"] for m in store.list_masters()} == {"nightly-report"}


def test_import_beat_dry_run_refuses_what_the_registration_refuses(tmp_path: Path) -> None:
    """A non-positive interval and args the serializer cannot encode: the dry run refuses
    them as the registration does, each named, with no traceback; the good entries go on."""
    url = f"sqlite:///{tmp_path / 'refused.db'}"
    store = empty_store(url)
    for dry_run in (("--dry-run",), ()):
        run = _celery(
            "-A", "tests.integration.beat_app", "ratchet", "import-beat", *dry_run,
            url=url, BEAT_APP_REFUSED="1",
        )  # fmt: skip
        assert run.returncode == 2, run.stderr
        assert "Traceback" not in run.stderr
        assert (
            "backwards: NOT IMPORTED: beat_schedule entry 'backwards': its interval must be "
            "positive, got -5 seconds"
        ) in run.stderr
        assert (
            "opaque: NOT IMPORTED: beat_schedule entry 'opaque': its args or kwargs cannot be "
            "serialised (Object of type object is not JSON serializable)"
        ) in run.stderr
        assert "2 of 4 beat_schedule entries were not imported" in run.stderr
        verb = "would register" if dry_run else "registered"
        assert f"heartbeat: {verb} beat.report every:900" in run.stdout
    assert {m["business_key"] for m in store.list_masters()} == {"nightly-report", "heartbeat"}


@pytest.mark.slow
def test_a_worker_refuses_to_start_on_a_refused_entry_naming_it_without_a_traceback(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'start.db'}"
    store = empty_store(url)
    run = _celery(
        "-A", "tests.integration.beat_app", "worker", "-P", "ratchet", "-c", "1",
        url=url, BEAT_APP_REFUSED="1",
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr and "Unrecoverable" not in run.stderr
    assert "ratchet: the worker does not start: 2 beat_schedule entries" in run.stderr
    assert "'backwards': its interval must be positive" in run.stderr
    assert "'opaque': its args or kwargs cannot be serialised" in run.stderr
    assert store.list_masters() == []


def test_import_beat_warns_of_an_entry_whose_task_the_app_does_not_have(tmp_path: Path) -> None:
    """Warned, not refused: the task may be one of another release's workers."""
    url = f"sqlite:///{tmp_path / 'unknown.db'}"
    store = empty_store(url)
    for dry_run in (("--dry-run",), ()):
        run = _celery(
            "-A", "tests.integration.beat_app", "ratchet", "import-beat", *dry_run,
            url=url, BEAT_APP_UNKNOWN="1",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        assert (
            "typo: WARNING: beat_schedule entry 'typo': task 'beat.reprot' is not registered "
            "in this app"
        ) in run.stderr
        assert "ratchet_unknown_task_grace_seconds" in run.stderr
        assert "nightly-report: WARNING" not in run.stderr
    assert "typo" in {m["business_key"] for m in store.list_masters()}


def test_jobs_filters_by_tag_and_business_key_and_cancel_revokes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tags.db'}"
    store = empty_store(url)
    tagged = replace(new_job("tagged"), tags=("billing", "eu"), business_key="order-7")
    store.enqueue_many([tagged, new_job("plain")])
    runner = CliRunner()

    def listed(*args: str) -> list[str]:
        out = runner.invoke(cli, ["--url", url, "jobs", *args, "--json"])
        assert out.exit_code == 0, out.output
        return [j["job_id"] for j in json.loads(out.output)]

    assert listed("--tag", "eu") == ["tagged"]
    assert listed("--tag", "e") == []
    assert listed("--key", "order-7") == ["tagged"]
    out = runner.invoke(cli, ["--url", url, "jobs", "cancel", "tagged", "missing"])
    assert out.exit_code == 0 and "cancelled 1 pending" in out.output
    assert "1 already finished or unknown" in out.output
    record = store.result("tagged")
    assert record is not None and record.status is JobStatus.REVOKED


def test_batches_lists_progress_and_shows_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'batches.db'}"
    store = empty_store(url)
    batches = BatchStore(store)
    batches.open(NewBatch("import", BatchKind.BATCH, 4, name="Import users"))
    for i in range(3):
        batches.record_part(BatchPart("import", f"c{i}", i, "SUCCESS" if i else "FAILURE", None))
    store.enqueue_many([replace(new_job(f"g{i}"), group_id="grp") for i in range(2)])
    batches.open_groups(["grp"])
    runner = CliRunner()
    listed = runner.invoke(cli, ["--url", url, "batches", "--json"])
    assert listed.exit_code == 0, listed.output
    rows = {r["batch_id"]: r for r in json.loads(listed.output)}
    assert (rows["import"]["done"], rows["import"]["total"], rows["import"]["failed"]) == (3, 4, 1)
    assert rows["import"]["percent_done"] == 75.0 and rows["import"]["name"] == "Import users"
    assert (rows["grp"]["kind"], rows["grp"]["done"], rows["grp"]["total"]) == ("GROUP", 0, 2)
    table = runner.invoke(cli, ["--url", url, "batches"]).output
    assert "PERCENT_DONE" in table and "Import users" in table
    shown = runner.invoke(cli, ["--url", url, "batches", "show", "import"])
    assert "75.0" in shown.output
    missing = runner.invoke(cli, ["--url", url, "batches", "show", "nope"])
    assert missing.exit_code == 2 and "no batch 'nope'" in missing.output
    open_only = runner.invoke(cli, ["--url", url, "batches", "--state", "open", "--json"])
    assert {r["batch_id"] for r in json.loads(open_only.output)} == {"import", "grp"}


def test_batches_show_how_much_of_an_open_stream_was_written(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'streams.db'}"
    batches = BatchStore(empty_store(url))
    batches.open(NewBatch("st", BatchKind.STREAM, None, name="Export"), lease_seconds=60)
    batches.write_chunk("st", [replace(new_job(f"s{i}"), group_id="st") for i in range(3)], [],
                        3, 60)  # fmt: skip
    listed = CliRunner().invoke(cli, ["--url", url, "batches", "--json"])
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.output)
    assert (row["kind"], row["state"], row["total"], row["written"]) == ("STREAM", "OPEN", None, 3)


def _bad_urls(tmp_path: Path) -> dict[str, tuple[str, str]]:
    """URL -> (what the error must say, a secret it must not show)."""
    garbage = tmp_path / "notes.txt"
    garbage.write_text("root:x:0:0:root:/root:/bin/bash\n")
    pg_host = PG_HOST.rpartition("@")[2]
    mysql_host = MYSQL_HOST.rpartition("@")[2]
    return {
        f"sqlite:///{garbage}": ("is not a SQLite database", ""),
        f"sqlite:///{tmp_path}": ("may write the file and the directory", ""),
        "foo://u:hunter2@db.example/x": ("unsupported database 'foo'", "hunter2"),
        "postgresql://u:hunter2@127.0.0.1:1/x": ("cannot reach the job store", "hunter2"),
        f"mysql://root:hunter2@{mysql_host}/x": ("Access denied", "hunter2"),
        f"postgresql://no_such_role:hunter2@{pg_host}/postgres": (
            'role "no_such_role" does not exist',
            "hunter2",
        ),
    }


def test_a_bad_url_is_one_clear_line_for_every_command(tmp_path: Path) -> None:
    """Not a database, an unknown scheme, no server, a refused login: each command says
    what is wrong in one line, exit status 2, no traceback, no password."""
    commands = [["jobs"], ["stats"], ["nodes"], ["dlq", "list"], ["schedules"], ["batches"],
                ["schema", "check"], ["schema", "apply"], ["archive"]]  # fmt: skip
    runner = CliRunner()
    for url, (says, secret) in _bad_urls(tmp_path).items():
        server = url.partition("://")[0] in ("postgresql", "mysql") and ":1/" not in url
        if server and not _reachable(url.rpartition("@")[2].partition("/")[0]):
            continue
        for command in commands:
            result = runner.invoke(cli, ["--url", url, *command])
            shown = f"{url} {command}: {result.output!r} {result.exception!r}"
            assert result.exit_code == 2, shown
            assert says in result.output and result.output.count(says) == 1, shown
            assert not secret or secret not in result.output, shown


def _ratchet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "celery_ratchet.cli.main", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_file_that_is_no_database_prints_no_traceback(tmp_path: Path) -> None:
    """As run from a shell: ``ratchet --url sqlite:////etc/passwd jobs``."""
    garbage = tmp_path / "passwd"
    garbage.write_text("root:x:0:0:root:/root:/bin/bash\n")
    out = _ratchet("--url", f"sqlite:///{garbage}", "jobs")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"Error: the job store at sqlite:///{garbage} is not a SQLite database (file is not "
        "a database): check the path in the URL; `ratchet --url URL schema apply` creates a "
        "store at a path where no file is yet"
    ]


def test_an_unreachable_store_is_said_once() -> None:
    out = _ratchet("--url", "postgresql://u:hunter2@127.0.0.1:1/x", "stats")
    assert out.returncode == 2 and out.stdout == ""
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("Error: cannot reach the job store at postgresql://u:***@127.0.0.1:1/x")


def test_queues_are_paused_listed_and_resumed(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    store = empty_store(url)
    store.enqueue(new_job("mail-1", queue="emails"))
    runner = CliRunner()
    paused = runner.invoke(cli, ["--url", url, "queues", "pause", "emails", "--reason", "relay"])
    assert (paused.exit_code, paused.output) == (0, f"paused emails on {url}\n")
    again = runner.invoke(cli, ["--url", url, "queues", "pause", "emails"])
    assert again.output == f"emails was paused already on {url}\n"
    # A queue with no jobs yet can be paused ahead of them.
    assert runner.invoke(cli, ["--url", url, "queues", "pause", "reports"]).exit_code == 0
    listed = json.loads(runner.invoke(cli, ["--url", url, "queues", "list", "--json"]).output)
    assert [(q["queue"], q["pending"], q["reason"]) for q in listed] == [
        ("emails", 1, "relay"), ("reports", 0, None),
    ]  # fmt: skip
    assert "REASON" in runner.invoke(cli, ["--url", url, "queues"]).output
    resumed = runner.invoke(cli, ["--url", url, "queues", "resume", "emails"])
    assert resumed.output == f"resumed emails on {url}\n"
    assert runner.invoke(cli, ["--url", url, "queues", "resume", "emails"]).output == (
        f"emails was not paused on {url}\n"
    )
    refused = runner.invoke(cli, ["--url", url, "queues", "pause", "q" * 300])
    assert refused.exit_code == 2 and "at most 255" in refused.output
    assert sorted(store.paused_queues()) == ["reports"]


def test_dlq_list_shows_each_exception_as_dlq_show_does(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dlq.db'}"
    store = empty_store(url)
    store.enqueue_many([new_job("dead-0", task="tests.charge")])
    error = '{"exc_type": "CardDeclined", "exc_message": ["no funds"], "exc_module": "shop"}'
    store.settle(
        [Settlement(j.job_id, j.token, JobStatus.FAILED, error=error)
         for j in store.claim("n", ["celery"], 10)]
    )  # fmt: skip
    table = CliRunner().invoke(cli, ["--url", url, "dlq", "list"])
    assert table.exit_code == 0, table.output
    assert "CardDeclined: no funds" in table.output and "exc_type" not in table.output
    listed = CliRunner().invoke(cli, ["--url", url, "dlq", "list", "--json"])
    assert json.loads(listed.output)[0]["last_error"] == error


_TEN_MINUTES_EARLIER = {
    "sqlite": "datetime(heartbeat_ts, '-10 minutes')",
    "postgresql": "heartbeat_ts - INTERVAL '10 minutes'",
    "mysql": "heartbeat_ts - INTERVAL 10 MINUTE",
}


def test_nodes_says_which_ones_are_silent_past_the_grace(store: JobStore, dialect: str) -> None:
    store.register_node("alive-1", "h", 1, ["celery"], 2)
    store.register_node("gone-1", "h", 2, ["celery"], 2)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(
            f"UPDATE scheduler_node SET heartbeat_ts = {_TEN_MINUTES_EARLIER[dialect]} "
            "WHERE node_id = 'gone-1'"
        )
    out = CliRunner().invoke(cli, ["--url", store.url, "nodes", "--json"])
    assert out.exit_code == 0, out.output
    states = {n["node_id"]: (n["state"], n["heartbeat_age_s"]) for n in json.loads(out.output)}
    assert states["alive-1"][0] == "alive" and states["alive-1"][1] < 60
    assert states["gone-1"][0] == "silent" and states["gone-1"][1] >= 590


def test_every_change_names_the_store_it_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run without --url where a ./ratchet.db is, a command changes that file: it says so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RATCHET_URL", raising=False)
    store = empty_store("sqlite:///ratchet.db")
    store.enqueue(new_job("waiting"))
    runner = CliRunner()
    said = {
        args: runner.invoke(cli, list(args))
        for args in [
            ("schema", "apply"),
            ("queues", "pause", "celery"),
            ("queues", "resume", "celery"),
            ("jobs", "cancel", "waiting"),
            ("dlq", "retry", "--all"),
            ("dlq", "purge", "--yes"),
            ("archive",),
        ]
    }
    for args, out in said.items():
        assert out.exit_code == 0, (args, out.output)
        assert " on sqlite:///ratchet.db\n" in out.output, (args, out.output)
    assert said[("queues", "pause", "celery")].output == "paused celery on sqlite:///ratchet.db\n"


def test_the_store_named_has_its_password_masked(servers: Servers) -> None:
    url = servers.url("postgresql")
    empty_store(url)
    user, _, rest = url.removeprefix("postgresql://").partition("@")
    with_password = f"postgresql://{user}:s3cret@{rest}"  # trust: any password is taken
    out = CliRunner().invoke(cli, ["--url", with_password, "queues", "pause", "emails"])
    assert out.exit_code == 0, out.output
    assert out.output == f"paused emails on postgresql://{user}:***@{rest}\n"
    assert "s3cret" not in out.output
    JobStore(url).resume_queue("emails")


def test_dlq_retry_names_the_jobs_that_are_no_dead_letters(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'dlq.db'}"
    store = empty_store(url)
    for job_id in ("done", "dead"):
        store.enqueue(new_job(job_id))
    claimed = {j.job_id: j for j in store.claim("n", ["celery"], 10)}
    store.settle(
        [
            Settlement("done", claimed["done"].token, JobStatus.SUCCEEDED),
            Settlement("dead", claimed["dead"].token, JobStatus.FAILED, error="{}"),
        ]
    )
    runner = CliRunner()
    none = runner.invoke(cli, ["--url", url, "dlq", "retry", "done", "nope-id"])
    assert none.exit_code == 2, none.output
    assert none.output == (
        f"Error: requeued nothing on {url}: not dead letters, left alone: "
        "done (SUCCEEDED), nope-id (unknown)\n"
    )
    some = runner.invoke(cli, ["--url", url, "dlq", "retry", "dead", "nope-id"])
    assert some.exit_code == 0, some.output
    assert some.output == (
        f"requeued 1 job on {url}\nnot dead letters, left alone: nope-id (unknown)\n"
    )
    record = store.result("dead")
    assert record is not None and record.status is JobStatus.PENDING
