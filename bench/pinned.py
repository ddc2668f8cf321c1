"""The drains with the servers on a core of their own: the worker's figure without the
database's cpu taken from it.

    ./dev bench pinned [--jobs 10000] [--runs 2]

On this machine the job store shares the worker's two cores: a drain on PostgreSQL pays the
server's cpu (about 0.2-0.3 ms a job) out of the same budget as the worker, while Redis
costs Celery's worker almost nothing. In a deployment the database has a host of its own.
This runs the same drains as ``./dev bench --only drain`` with the servers moved out of the
worker's way: a private PostgreSQL cluster (fsync and synchronous commit on, as the shared
server has them) and a private Redis (no persistence, as the shared one) both pinned to the
last core, and the bench (its workers and their pool processes) pinned to the others, one
core on a two-core machine. Both sides get the same split: one core for the workers, one
for their server. Nothing here asserts anything; read the ratios.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.private_postgres import PrivatePostgres, free_port, pg_bin  # noqa: E402


class PinnedPostgres(PrivatePostgres):
    """A private cluster whose server processes run on ``cores`` only, durable as the
    shared server is (the test clusters turn fsync off)."""

    durability_options = ""

    def __init__(self, bin_dir: Path, cores: str) -> None:
        super().__init__(bin_dir)
        self.prefix = [*self.prefix, "taskset", "-c", cores]


def start_redis(cores: str, directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    command = ["taskset", "-c", cores, "redis-server", "--port", str(port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "no", "--dir", str(directory)]  # fmt: skip
    server = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while (
        subprocess.run(
            ["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True, check=False
        ).stdout.strip()
        != "PONG"
    ):
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the private Redis on port {port} did not start")
        time.sleep(0.05)
    return server, port


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs to drain")
    parser.add_argument("--runs", type=int, default=2, help="runs of the five drains")
    args = parser.parse_args(argv)
    cores = sorted(os.sched_getaffinity(0))
    missing = [tool for tool in ("taskset", "redis-server", "redis-cli") if not shutil.which(tool)]
    bin_dir = pg_bin()
    if len(cores) < 2 or missing or bin_dir is None:
        sys.exit(f"bench pinned needs two cores, PostgreSQL's server and {missing or 'taskset'}")
    server_cores, bench_cores = str(cores[-1]), ",".join(str(c) for c in cores[:-1])
    directory = Path(tempfile.mkdtemp(prefix="ratchet-pinned-"))
    postgres = PinnedPostgres(bin_dir, server_cores)
    redis_server = None
    try:
        postgres.init()
        redis_server, redis_port = start_redis(server_cores, directory)
        env = {
            **os.environ,
            "BENCH_PG_ADMIN": f"host=127.0.0.1 port={postgres.port} user=postgres dbname=postgres",
            "RATCHET_URL": f"postgresql://postgres@127.0.0.1:{postgres.port}/ratchet_bench",
            "BENCH_REDIS_URL": f"redis://127.0.0.1:{redis_port}/15",
        }
        print(f"servers on core {server_cores}, the bench and its workers on {bench_cores}")
        for run in range(args.runs):
            print(f"run {run + 1} of {args.runs}", flush=True)
            drains = ["taskset", "-c", bench_cores, sys.executable, str(ROOT / "bench" / "run.py"),
                      "--only", "drain", "--jobs", str(args.jobs)]  # fmt: skip
            subprocess.run(drains, env=env, check=True)
    finally:
        if redis_server is not None:
            redis_server.terminate()
            redis_server.wait(30)
        postgres.destroy()
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
