"""A private PostgreSQL cluster for tests that stop, kill or restart the database server.

initdb into a temporary directory, on a free port, with trust authentication: never the shared
server other test runs use.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NoReturn

import pytest

from tests.conftest import IN_CI


def _version(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path.parent.parent.name))


def pg_bin() -> Path | None:
    """The directory of initdb and pg_ctl: on PATH, else the newest Debian/Ubuntu install."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    installed = [
        p.parent
        for p in sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=_version)
        if (p.parent / "initdb").exists()
    ]
    return installed[-1] if installed else None


def unavailable(
    reason: str, needed_for: str = "to restart a private PostgreSQL server"
) -> NoReturn:
    if IN_CI:
        pytest.fail(f"{reason}: CI requires it {needed_for}")
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1:<free port>, with trust authentication.

    initdb refuses to run as root: as root, every pg command runs as the ``postgres`` user,
    which owns the temporary directory.
    """

    def __init__(self, bin_dir: Path, root: Path | None = None) -> None:
        self.bin = bin_dir
        self.prefix: list[str] = []
        self.dir = Path(tempfile.mkdtemp(prefix="ratchet-pg-", dir=root))
        if os.geteuid() == 0:
            try:
                owner = pwd.getpwnam("postgres")
            except KeyError:
                shutil.rmtree(self.dir)
                unavailable("running as root and there is no postgres user to run initdb")
            if shutil.which("runuser") is None:
                shutil.rmtree(self.dir)
                unavailable("running as root and runuser is missing")
            os.chown(self.dir, owner.pw_uid, owner.pw_gid)
            self.prefix = ["runuser", "-u", "postgres", "--"]
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self.port = 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        command = [*self.prefix, str(self.bin / tool), *args]
        done = subprocess.run(
            command, cwd=self.dir, capture_output=True, text=True, timeout=120, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
                f"\n{self.server_log()}"
            )

    def server_log(self) -> str:
        try:
            return self.log.read_text()[-4000:]
        except OSError:
            return ""

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                  "--no-sync")  # fmt: skip
        self._start_on_a_free_port()

    def init_standby_of(self, primary: PrivatePostgres) -> None:
        """A streaming replica of ``primary`` (``pg_basebackup -R``), started on its own port."""
        self._run("pg_basebackup", "-D", str(self.data), "-h", "127.0.0.1", "-p",
                  str(primary.port), "-U", "postgres", "-R", "-X", "stream", "-c", "fast",
                  "--no-sync")  # fmt: skip
        self._start_on_a_free_port()

    def promote(self) -> None:
        """A standby becomes a primary (``pg_ctl promote``), once it accepts writes."""
        self._run("pg_ctl", "promote", "-D", str(self.data), "-w", "-t", "60")

    def _start_on_a_free_port(self) -> None:
        for _ in range(5):  # another process may take the free port before the server does
            self.port = free_port()
            try:
                self.start()
                return
            except RuntimeError:
                if f"{self.port}" not in self.server_log():
                    raise
        raise RuntimeError(f"no free port for PostgreSQL:\n{self.server_log()}")

    #: Throwaway data: no flush to disk (a durable cluster sets this empty).
    durability_options = " -c fsync=off -c full_page_writes=off"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        options += self.durability_options
        self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log), "-w", "-t",
                  "60", "-o", options)  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", "60")

    def destroy(self) -> None:
        """Whatever state it is in: stop the server, remove its files."""
        pidfile = self.data / "postmaster.pid"
        if pidfile.exists():
            try:
                self.stop("immediate")
            except (RuntimeError, subprocess.TimeoutExpired):
                with contextlib.suppress(ValueError, OSError):
                    os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def postmaster_pid(self) -> int:
        """The server's main process (its first line of postmaster.pid)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def kill(self) -> None:
        """``kill -9`` of the postmaster, as a crash would; returns when it is gone. Its
        backends notice and exit; a later :meth:`start` recovers from the write-ahead log."""
        pid = self.postmaster_pid()
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        raise RuntimeError(f"postmaster {pid} still runs after SIGKILL")

    def restart_after_crash(self, timeout: float = 60) -> None:
        """Start again after :meth:`kill`, once the old backends have let go of the data
        directory (each exits when it notices its postmaster is gone)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.start()
                return
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)


def start_private_postgres(root: Path | None = None) -> PrivatePostgres:
    """A new, running private cluster (skips, or fails under CI, where none can be made);
    its files under ``root`` (default: the temporary directory)."""
    bin_dir = pg_bin()
    if bin_dir is None:
        unavailable("PostgreSQL server binaries (initdb, pg_ctl) not found")
    server = PrivatePostgres(bin_dir, root)
    try:
        server.init()
    except BaseException:
        server.destroy()
        raise
    return server
