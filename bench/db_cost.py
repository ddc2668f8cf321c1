"""What the database pays per drained job: PostgreSQL's cpu, WAL and commits, beside
pgqueuer and procrastinate draining the same no-op jobs on the same server.

    ./dev bench db-cost [--jobs 20000] [--systems ratchet-threads,...,procrastinate]
    ./dev bench db-cost --compare PATH [--rounds 3]   this checkout against the one at PATH

A private PostgreSQL cluster (durable as the shared server: fsync, synchronous commit and
full-page writes on; autovacuum off, as there; no checkpoint inside a run;
pg_stat_statements loaded), so that no other user of the machine's server is in the
figures. Each run has a database of its own: the system's schema is made, N jobs are sent
one call (and one commit) each, the table is vacuumed and analyzed, then one worker drains
them, from its start to its stop. The figures are differences over the drain, divided by N:

- PostgreSQL cpu: user and system time of the postmaster and every process it started, read
  from /proc (exited backends through the postmaster's children's times), so the worker's
  connections, the WAL writer and the checkpointer are in it; pg_stat_statements' execution
  time of the database's statements is the second view;
- WAL bytes (``pg_current_wal_lsn()`` before and after), of which full-page images;
- commits (``pg_stat_database.xact_commit``, read-only ones too) and the WAL's commit
  records (transactions that wrote, each a flush of the WAL to disk);
- rows inserted, updated (of which heap-only), deleted (``pg_stat_user_tables``) and index
  entries written (the WAL's B-tree insert records, per index through pg_walinspect);
- the VACUUM that the drain's dead rows need afterwards: its cpu and WAL, apart.

"jobs/s per PG core" is 1 / (cpu seconds per job): the rate at which one core of the
database would be busy with nothing else, whatever the number of workers sharing it.
pgqueuer and procrastinate run from a virtualenv of their own (bench/db_cost_peers.py,
made under /tmp on first use); celery_ratchet's workers are ``celery worker -P threads`` and
``-P ratchet`` (prefork) with ``-c 4``, results off (``ignore_result``) and on.
Nothing here asserts anything; read the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import redis  # noqa: E402

from bench.pinned import start_redis  # noqa: E402
from bench.procs import children  # noqa: E402
from tests.private_postgres import PrivatePostgres, pg_bin  # noqa: E402

DB = "ratchet_cost"
PEERS_VENV = Path(tempfile.gettempdir()) / "ratchet-bench-peers"
PEERS = ["pgqueuer==1.6.0", "procrastinate==3.10.0", "psycopg[binary]>=3.2"]
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class CostCluster(PrivatePostgres):
    """The private cluster of this bench: durable (no ``fsync=off`` of the test clusters),
    pg_stat_statements loaded, no autovacuum and no checkpoint within a run."""

    durability_options = (
        " -c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=top"
        " -c pg_stat_statements.track_planning=on"
        " -c autovacuum=off -c checkpoint_timeout=3600 -c max_wal_size=20GB"
    )


@dataclass(frozen=True)
class System:
    """One way of draining: a system, its worker's pool and whether results are kept."""

    name: str
    label: str
    pool: str = ""
    task: str = "bench.noop"

    @property
    def ratchet(self) -> bool:
        return self.name.startswith("ratchet")


SYSTEMS = {
    s.name: s
    for s in (
        System("ratchet-threads", "celery_ratchet -P threads, results off", "threads"),
        System(
            "ratchet-threads-results",
            "celery_ratchet -P threads, results on",
            "threads",
            "bench.echo",
        ),
        System("ratchet-prefork", "celery_ratchet -P ratchet (prefork), results off", "ratchet"),
        System(
            "ratchet-prefork-results",
            "celery_ratchet -P ratchet (prefork), results on",
            "ratchet",
            "bench.echo",
        ),
        System("pgqueuer", "pgqueuer 1.6.0 (batches of 10)"),
        System("procrastinate", "procrastinate 3.10.0 (concurrency 4)"),
    )
}


# -- the server's counters ---------------------------------------------------------------


def _proc_times(pid: int) -> tuple[int, int, str] | None:
    """(own ticks, reaped children's ticks, state) of a process; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # fields[0] is the state (field 3); utime, stime, cutime, cstime are fields 14-17.
    return int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14]), fields[0]


def _children(parent: int) -> list[int]:
    return children().get(parent, [])


def server_cpu(postmaster: int) -> float:
    """Seconds of cpu the cluster has used: the postmaster's own, its reaped children's
    (backends that exited), and every live child's."""
    own = _proc_times(postmaster)
    assert own is not None, "the private cluster is gone"
    ticks = own[0] + own[1]
    for child in _children(postmaster):
        times = _proc_times(child)
        if times is not None:
            ticks += times[0]
    return ticks / CLOCK_TICKS


@dataclass
class Snapshot:
    cpu: float
    lsn: int
    wal_fpi: int
    commits: int
    rollbacks: int
    tuples: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


#: The bench's own reads of the measured database (its row counts), left out of its statements.
_NOT_OURS = "s.query NOT LIKE '%%pg_stat_user_tables%%'"


class Server:
    """The cluster as the bench reads it: an admin connection to ``postgres`` (never to a
    measured database, so its own statements are not counted there)."""

    def __init__(self, cluster: CostCluster) -> None:
        self.cluster = cluster
        self.admin = psycopg.connect(self.dsn("postgres"), autocommit=True)
        self.admin.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        self.admin.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")

    def dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.cluster.port} user=postgres dbname={dbname}"

    def url(self, dbname: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.cluster.port}/{dbname}"

    def fresh_database(self) -> None:
        self.admin.execute(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)')
        self.admin.execute(f'CREATE DATABASE "{DB}"')

    def quiet(self, timeout: float = 120) -> None:
        """Wait until no session of the measured database is left and every exited backend
        was reaped (its cpu is then in the postmaster's children's times, its counters
        flushed)."""
        postmaster = self.cluster.postmaster_pid()
        deadline = time.monotonic() + timeout
        while True:
            row = self.admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (DB,)
            ).fetchone()
            sessions = int(row[0]) if row else 0
            zombies = [
                c
                for c in _children(postmaster)
                if (times := _proc_times(c)) is not None and times[2] == "Z"
            ]
            if not sessions and not zombies:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{sessions} sessions of {DB} still open after {timeout} s")
            time.sleep(0.1)
        time.sleep(0.5)

    def snapshot(self, with_tuples: bool = False) -> Snapshot:
        self.quiet()
        cpu = server_cpu(self.cluster.postmaster_pid())
        lsn, fpi = self.admin.execute(
            "SELECT pg_current_wal_lsn()::text, wal_fpi FROM pg_stat_wal"
        ).fetchone() or ("0/0", 0)
        self.admin.execute("SELECT pg_stat_clear_snapshot()")
        commits, rollbacks = self.admin.execute(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s", (DB,)
        ).fetchone() or (0, 0)
        snap = Snapshot(cpu, _lsn(lsn), int(fpi), int(commits), int(rollbacks))
        if with_tuples:
            snap.tuples = self.tuples()
        return snap

    def tuples(self) -> dict[str, tuple[int, int, int, int]]:
        """Rows inserted, updated, updated heap-only and deleted, per table of the measured
        database (read there: the view is per database; its one read-only transaction is
        counted in the next window's commits, the same one for every system)."""
        with psycopg.connect(self.dsn(DB), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
                "FROM pg_stat_user_tables"
            ).fetchall()
        return {r[0]: (int(r[1]), int(r[2]), int(r[3]), int(r[4])) for r in rows}

    def in_database(self, sql: str) -> None:
        with psycopg.connect(self.dsn(DB), autocommit=True) as conn:
            conn.execute(sql)

    def statements(self, limit: int = 12) -> list[dict[str, Any]]:
        """The measured database's statements since the last reset, most time first."""
        rows = self.admin.execute(
            "SELECT s.query, s.calls, s.total_exec_time, s.total_plan_time, s.rows, "
            "s.wal_records, s.wal_bytes, s.wal_fpi, s.shared_blks_dirtied "
            "FROM pg_stat_statements s "
            "JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s "
            f"AND {_NOT_OURS} ORDER BY s.total_exec_time DESC",
            (DB,),
        ).fetchall()
        keys = ("query", "calls", "ms", "plan_ms", "rows", "wal_records", "wal_bytes", "wal_fpi",
                "dirtied")  # fmt: skip
        found = [dict(zip(keys, row, strict=True)) for row in rows]
        for s in found:
            s["query"] = " ".join(str(s["query"]).split())
            s["ms"] = float(s["ms"])
            s["plan_ms"] = float(s["plan_ms"])
            s["wal_bytes"] = int(s["wal_bytes"])
        total = sum(s["ms"] for s in found)
        return [{**s, "share": s["ms"] / total if total else 0.0} for s in found[:limit]]

    def statements_total(self) -> tuple[float, float, int]:
        """Execution and planning time (ms) and calls of every statement of the measured
        database."""
        row = self.admin.execute(
            "SELECT coalesce(sum(s.total_exec_time), 0), coalesce(sum(s.total_plan_time), 0), "
            "coalesce(sum(s.calls), 0) "
            "FROM pg_stat_statements s "
            f"JOIN pg_database d ON d.oid = s.dbid WHERE d.datname = %s AND {_NOT_OURS}",
            (DB,),
        ).fetchone()
        return (float(row[0]), float(row[1]), int(row[2])) if row else (0.0, 0.0, 0)

    def wal_records(self, start: int, end: int) -> dict[str, dict[str, int]]:
        """The WAL between two positions: per record type its count, bytes and full-page
        image bytes; and per relation (a table or index of the measured database) the
        records that wrote a block of it, by type."""
        begin, stop = (f"{p >> 32:X}/{p & 0xFFFFFFFF:X}" for p in (start, end))
        by_type = {
            f"{rm}/{kind}": {"count": int(n), "bytes": int(b), "fpi": int(f)}
            for rm, kind, n, b, f in self.admin.execute(
                "SELECT resource_manager, split_part(record_type, ' ', 1), count(*), "
                "sum(record_length), sum(fpi_length) "
                "FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn) GROUP BY 1, 2",
                (begin, stop),
            ).fetchall()
        }
        relations: dict[str, dict[str, int]] = {}
        rows = self.admin.execute(
            "SELECT resource_manager || '/' || split_part(record_type, ' ', 1), "
            "substring(block_ref from 'rel \\d+/\\d+/(\\d+) fork main'), count(*) "
            "FROM pg_get_wal_records_info(%s::pg_lsn, %s::pg_lsn) "
            "WHERE resource_manager IN ('Heap', 'Heap2', 'Btree') GROUP BY 1, 2",
            (begin, stop),
        ).fetchall()
        names = self.relation_names()
        for kind, node, n in rows:
            name = names.get(int(node), f"relfilenode {node}") if node else "(none)"
            relations.setdefault(name, {})[kind] = int(n)
        return {"by_type": by_type, **{f"rel:{k}": v for k, v in relations.items()}}

    def relation_names(self) -> dict[int, str]:
        with psycopg.connect(self.dsn(DB), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_relation_filenode(c.oid), c.relname FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') "
                "AND c.relkind IN ('r', 'i', 'p', 'I')"
            ).fetchall()
        return {int(node): str(name) for node, name in rows if node is not None}

    def close(self) -> None:
        self.admin.close()


# -- the systems -------------------------------------------------------------------------


def peers_python() -> Path:
    """The python of the virtualenv holding pgqueuer and procrastinate, made on first use."""
    python = PEERS_VENV / "bin" / "python"
    if not python.exists():
        print(f"installing {', '.join(PEERS)} into {PEERS_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *PEERS], check=True)
    return python


_RATCHET_SCHEMA = (
    "import os; from celery_ratchet.store.jobstore import JobStore; "
    "JobStore(os.environ['RATCHET_URL']).ensure_schema()"
)
# One .delay() a job, as an application sends (a producer held across sends would write them
# as one bulk insert); with a rate (jobs/s, 0: at once), paced to it.
_RATCHET_SEND = (
    "import sys, time; from bench.apps import ratchet_app\n"
    "sig, rate = ratchet_app.tasks[sys.argv[1]], float(sys.argv[3])\n"
    "start = time.monotonic()\n"
    "for i in range(int(sys.argv[2])):\n"
    "    sig.delay(i)\n"
    "    if rate:\n"
    "        time.sleep(max(0.0, start + (i + 1) / rate - time.monotonic()))\n"
)


def _tail(path: str | bytes | int) -> str:
    return Path(str(path)).read_text(errors="replace")[-3000:]


class Runner:
    """Runs one system's steps: celery_ratchet's from a checkout (``root``, this one unless
    compared with another), the others from their virtualenv."""

    def __init__(self, server: Server, redis_url: str, log_dir: Path) -> None:
        self.server = server
        self.redis_url = redis_url
        self.board = redis.Redis.from_url(redis_url)
        self.log_dir = log_dir

    def _env(self, root: Path) -> dict[str, str]:
        return {**os.environ, "RATCHET_URL": self.server.url(DB), "BENCH_REDIS_URL":
                self.redis_url, "PYTHONPATH": str(root)}  # fmt: skip

    def _peer(self, system: System, step: str, jobs: int = 0) -> list[str]:
        return [str(peers_python()), str(ROOT / "bench" / "db_cost_peers.py"), system.name, step,
                "--dsn", self.server.dsn(DB), "--jobs", str(jobs)]  # fmt: skip

    def schema(self, system: System, root: Path, after: str = "") -> None:
        """Make the system's tables, then run ``after`` (SQL) on celery_ratchet's: a
        variant of its schema tried without a checkout of its own."""
        if system.ratchet:
            command = [sys.executable, "-c", _RATCHET_SCHEMA]
        else:
            command = self._peer(system, "schema")
        subprocess.run(command, cwd=root, env=self._env(root), check=True)
        if after and system.ratchet:
            self.server.in_database(after)

    def send(self, system: System, root: Path, jobs: int, rate: float = 0.0) -> None:
        if system.ratchet:
            command = [sys.executable, "-c", _RATCHET_SEND, system.task, str(jobs), str(rate)]
        else:
            command = self._peer(system, "send", jobs)
        subprocess.run(command, cwd=root, env=self._env(root), check=True)

    def drain(self, system: System, root: Path, jobs: int, rate: float = 0.0) -> float:
        """Start one worker on the sent jobs, stop it once they ran; the seconds it took.
        With a ``rate`` (celery_ratchet only), the jobs are sent at that rate while the
        worker runs, after a first one that it ran."""
        log = (self.log_dir / f"{system.name}.log").open("wb")
        started = time.perf_counter()
        if not system.ratchet:
            worker = subprocess.Popen(self._peer(system, "drain"), cwd=root, env=self._env(root),
                                      stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            if worker.wait(900) != 0:
                raise RuntimeError(f"{system.label}: the worker failed:\n{_tail(log.name)}")
            return time.perf_counter() - started
        self.board.delete("ratchet:done")
        command = [sys.executable, "-m", "celery", "-A", "bench.apps:ratchet_app", "--quiet",
                   "worker", "-P", system.pool, "-c", "4", "-l", "warning",
                   "--without-heartbeat", "--without-gossip", "--without-mingle"]  # fmt: skip
        worker = subprocess.Popen(command, cwd=root, env=self._env(root), stdout=log,
                                  stderr=subprocess.STDOUT)  # fmt: skip
        try:
            if rate:
                self.send(system, root, 1)
                self._wait_done(1, worker, started, system, log.name)
                self.send(system, root, jobs - 1, rate)
            self._wait_done(jobs, worker, started, system, log.name)
            elapsed = time.perf_counter() - started
        finally:
            worker.terminate()  # a warm shutdown: the last outcomes are written first
            try:
                worker.wait(120)
            except subprocess.TimeoutExpired:
                worker.kill()
        return elapsed

    def _wait_done(
        self, jobs: int, worker: subprocess.Popen[bytes], started: float, system: System, log: str
    ) -> None:
        while int(self.board.get("ratchet:done") or 0) < jobs:
            if worker.poll() is not None or time.perf_counter() - started > 900:
                raise RuntimeError(f"{system.label}: not drained:\n{_tail(log)}")
            time.sleep(0.02)

    def finished(self, system: System) -> int:
        """How many of the sent jobs the database holds as run (after the measurements)."""
        count = {
            "pgqueuer": "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'",
            "procrastinate": "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
        }.get(system.name, "SELECT count(*) FROM scheduler_job WHERE status = 'SUCCEEDED'")
        with psycopg.connect(self.server.dsn(DB), autocommit=True) as conn:
            row = conn.execute(count).fetchone()
        return int(row[0]) if row else 0


# -- one run -----------------------------------------------------------------------------


def _per_job(before: Snapshot, after: Snapshot, jobs: int) -> dict[str, float]:
    ins = upd = hot = dele = 0
    for table, (i, u, h, d) in after.tuples.items():
        i0, u0, h0, d0 = before.tuples.get(table, (0, 0, 0, 0))
        ins, upd, hot, dele = ins + i - i0, upd + u - u0, hot + h - h0, dele + d - d0
    return {
        "cpu_ms": (after.cpu - before.cpu) * 1000 / jobs,
        "wal_bytes": (after.lsn - before.lsn) / jobs,
        "wal_fpi": (after.wal_fpi - before.wal_fpi) / jobs,
        "commits": (after.commits - before.commits) / jobs,
        "rollbacks": (after.rollbacks - before.rollbacks) / jobs,
        "inserted": ins / jobs,
        "updated": upd / jobs,
        "hot_updated": hot / jobs,
        "deleted": dele / jobs,
    }


_INDEX_WRITES = ("Btree/INSERT_LEAF", "Btree/INSERT_UPPER", "Btree/INSERT_POST", "Btree/DEDUP",
                 "Btree/SPLIT_L", "Btree/SPLIT_R", "Btree/NEWROOT")  # fmt: skip


def run_one(
    runner: Runner,
    system: System,
    root: Path,
    jobs: int,
    after_schema: str = "",
    rate: float = 0.0,
) -> dict[str, Any]:
    """Send ``jobs``, then drain them; or with a ``rate``, send them at that rate to a worker
    already running, the figures then the send's and the drain's together."""
    server = runner.server
    server.fresh_database()
    runner.schema(system, root, after_schema)
    server.admin.execute("CHECKPOINT")
    sent0 = server.snapshot(with_tuples=True)
    if not rate:
        runner.send(system, root, jobs)
    sent1 = server.snapshot(with_tuples=True)
    server.in_database("VACUUM ANALYZE")
    server.admin.execute("SELECT pg_stat_statements_reset()")
    before = server.snapshot(with_tuples=True)
    seconds = runner.drain(system, root, jobs, rate)
    after = server.snapshot(with_tuples=True)
    statements_ms, plan_ms, calls = server.statements_total()
    statements = server.statements()
    server.in_database("VACUUM")
    vacuumed = server.snapshot()
    wal = server.wal_records(before.lsn, after.lsn)
    done = runner.finished(system)
    if done < jobs:
        raise RuntimeError(f"{system.label}: {done} of {jobs} jobs ran")
    drain = _per_job(before, after, jobs)
    by_type = wal["by_type"]
    drain["commit_records"] = by_type.get("Transaction/COMMIT", {}).get("count", 0) / jobs
    drain["index_writes"] = sum(by_type.get(k, {}).get("count", 0) for k in _INDEX_WRITES) / jobs
    drain["statements_ms"] = statements_ms / jobs
    drain["plan_ms"] = plan_ms / jobs
    drain["statement_calls"] = calls / jobs
    drain["jobs_per_core_s"] = 1000 / drain["cpu_ms"] if drain["cpu_ms"] else float("inf")
    return {
        "system": system.name,
        "label": system.label,
        "root": str(root),
        "jobs": jobs,
        "seconds": seconds,
        "drain": drain,
        "vacuum": {
            "cpu_ms": (vacuumed.cpu - after.cpu) * 1000 / jobs,
            "wal_bytes": (vacuumed.lsn - after.lsn) / jobs,
        },
        "send": _per_job(sent0, sent1, jobs),
        "rate": rate,
        "statements": statements,
        "wal": wal,
    }


# -- output ------------------------------------------------------------------------------

_COLUMNS = [
    ("PG cpu ms", "cpu_ms", "{:.3f}"),
    ("exec ms", "statements_ms", "{:.3f}"),
    ("plan ms", "plan_ms", "{:.3f}"),
    ("stmts", "statement_calls", "{:.2f}"),
    ("jobs/s per PG core", "jobs_per_core_s", "{:,.0f}"),
    ("WAL B", "wal_bytes", "{:,.0f}"),
    ("of which FPI", "wal_fpi", "{:.2f}"),
    ("commits", "commits", "{:.3f}"),
    ("WAL commits", "commit_records", "{:.3f}"),
    ("ins", "inserted", "{:.2f}"),
    ("upd", "updated", "{:.2f}"),
    ("HOT", "hot_updated", "{:.2f}"),
    ("del", "deleted", "{:.2f}"),
    ("index writes", "index_writes", "{:.2f}"),
]


def show_run(result: dict[str, Any], statements: int) -> None:
    d, v, s = result["drain"], result["vacuum"], result["send"]
    rate = result["jobs"] / result["seconds"]
    print(f"  {result['label']}: drained {result['jobs']:,} in {result['seconds']:.1f} s "
          f"({rate:,.0f} jobs/s)", flush=True)  # fmt: skip
    print("    per job: " + ", ".join(f"{name} {fmt.format(d[key])}"
                                      for name, key, fmt in _COLUMNS))  # fmt: skip
    print(f"    vacuum after it: cpu {v['cpu_ms']:.3f} ms, WAL {v['wal_bytes']:,.0f} B a job; "
          f"the send: cpu {s['cpu_ms']:.3f} ms, WAL {s['wal_bytes']:,.0f} B, "
          f"commits {s['commits']:.2f} a job")  # fmt: skip
    relations = {k[4:]: v for k, v in result["wal"].items() if k.startswith("rel:")}
    for name, kinds in sorted(relations.items(), key=lambda kv: -sum(kv[1].values())):
        counts = ", ".join(f"{k} {n / result['jobs']:.2f}" for k, n in sorted(kinds.items()))
        print(f"    WAL records a job on {name}: {counts}")
    for st in result["statements"][:statements]:
        print(
            f"    {st['share']:6.1%} {st['calls']:>7} calls {st['ms']:>9.1f} ms "
            f"(plan {st['plan_ms']:.1f}) "
            f"{st['rows']:>7} rows {st['wal_bytes']:>11,} WAL B  {st['query'][:110]}"
        )


def table(results: list[dict[str, Any]]) -> str:
    header = "| system | " + " | ".join(name for name, _, _ in _COLUMNS) + " | drain jobs/s |"
    lines = [header, "|---" * (len(_COLUMNS) + 2) + "|"]
    for r in results:
        d = r["drain"]
        cells = " | ".join(fmt.format(d[key]) for _, key, fmt in _COLUMNS)
        lines.append(f"| {r['label']} | {cells} | {r['jobs'] / r['seconds']:,.0f} |")
    return "\n".join(lines)


# -- main --------------------------------------------------------------------------------


@contextmanager
def servers() -> Iterator[tuple[Server, str, Path]]:
    """A private PostgreSQL cluster and a private Redis (the tasks' done counter)."""
    bin_dir = pg_bin()
    if bin_dir is None or not shutil.which("redis-server"):
        sys.exit("bench db-cost needs PostgreSQL's server binaries and redis-server")
    directory = Path(tempfile.mkdtemp(prefix="ratchet-cost-"))
    cluster = CostCluster(bin_dir)
    redis_server = None
    server = None
    try:
        cluster.init()
        cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
        redis_server, redis_port = start_redis(cores, directory)
        server = Server(cluster)
        yield server, f"redis://127.0.0.1:{redis_port}/0", directory
    finally:
        if server is not None:
            server.close()
        if redis_server is not None:
            redis_server.terminate()
            redis_server.wait(30)
        cluster.destroy()
        shutil.rmtree(directory, ignore_errors=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs sent, then drained")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"comma-separated, of {', '.join(SYSTEMS)}")  # fmt: skip
    parser.add_argument("--compare", type=Path, metavar="PATH",
                        help="a checkout of celery_ratchet to alternate with this one")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=1, help="runs of each system")
    parser.add_argument("--after-schema", default="", metavar="SQL",
                        help="SQL run on celery_ratchet's tables once made")  # fmt: skip
    parser.add_argument("--statements", type=int, default=6, help="statements shown per run")
    parser.add_argument("--steady", type=float, default=0.0, metavar="RATE",
                        help="send at RATE jobs/s to a running worker")  # fmt: skip
    args = parser.parse_args(argv)
    chosen = [SYSTEMS[name] for name in args.systems.split(",") if name]
    if args.compare is not None or args.steady:
        chosen = [s for s in chosen if s.ratchet]
    results: list[dict[str, Any]] = []
    with servers() as (server, redis_url, directory):
        runner = Runner(server, redis_url, directory)
        print(f"private PostgreSQL on port {server.cluster.port}; {args.jobs:,} jobs a drain",
              flush=True)  # fmt: skip
        for round_ in range(args.rounds):
            roots = [("this checkout", ROOT)]
            if args.compare is not None:
                roots.append(("compared", args.compare.resolve()))
                if round_ % 2:
                    roots.reverse()
            for system in chosen:
                for name, root in roots if system.ratchet else roots[:1]:
                    print(f"round {round_ + 1}, {system.label}, {name} ({root})", flush=True)
                    result = run_one(
                        runner, system, root, args.jobs, args.after_schema, args.steady
                    )
                    result["code"] = name
                    show_run(result, args.statements)
                    results.append(result)
    print()
    print(table(results))
    if args.compare is not None:
        compare_summary(results)
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    path = out / time.strftime("db-cost-%Y%m%d-%H%M%S.json")
    path.write_text(json.dumps(results, indent=2))
    print(f"written: {path.relative_to(ROOT)}")


_COMPARED = (("PG cpu ms", "cpu_ms"), ("WAL B", "wal_bytes"), ("commits", "commits"),
             ("index writes", "index_writes"), ("drain s", "seconds"))  # fmt: skip


def compare_summary(results: list[dict[str, Any]]) -> None:
    """Each system's figures, this checkout against the compared one: each pair's ratio
    (this / compared) and the medians."""
    print("\nthis checkout / compared, a job (each pair's ratio; medians):")
    for name in dict.fromkeys(r["system"] for r in results):
        runs = [r for r in results if r["system"] == name]
        mine = [{**r["drain"], "seconds": r["seconds"]} for r in runs if r["code"] != "compared"]
        theirs = [{**r["drain"], "seconds": r["seconds"]} for r in runs if r["code"] == "compared"]
        print(f"  {SYSTEMS[name].label}:")
        for label, key in _COMPARED:
            pairs = zip(mine, theirs, strict=True)
            ratios = ", ".join(f"{x[key] / y[key]:.2f}" for x, y in pairs if y[key])
            ours = statistics.median(d[key] for d in mine)
            before = statistics.median(d[key] for d in theirs)
            print(f"    {label}: {ours:,.3f} / {before:,.3f} (pairs: {ratios})")


if __name__ == "__main__":
    main(sys.argv[1:])
