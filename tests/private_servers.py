"""Private PgBouncer and MariaDB Galera servers for the tests of those deployments (private
PostgreSQL clusters are in tests/private_postgres.py): each on 127.0.0.1:<free port>, in its
own temporary directory, never the shared servers other test runs use, never a system service.

Missing binaries skip the test, except under ``CI=true``, where they fail it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.private_postgres import free_port, unavailable


def as_user(directory: Path, user: str, needed_for: str) -> list[str]:
    """The command prefix that runs a server as ``user`` when we are root (PostgreSQL, PgBouncer
    and MariaDB refuse to run as root), after giving it ``directory``; else nothing."""
    if os.geteuid() != 0:
        return []
    try:
        owner = pwd.getpwnam(user)
    except KeyError:
        shutil.rmtree(directory, ignore_errors=True)
        unavailable(f"running as root and there is no {user} user", needed_for)
    if shutil.which("runuser") is None:
        shutil.rmtree(directory, ignore_errors=True)
        unavailable("running as root and runuser is missing", needed_for)
    os.chown(directory, owner.pw_uid, owner.pw_gid)
    return ["runuser", "-u", user, "--"]


class PrivatePgBouncer:
    """PgBouncer on 127.0.0.1:<free port> in front of one database of a PostgreSQL server,
    with its configuration in a temporary directory (never the system's service)."""

    def __init__(
        self,
        server_port: int,
        database: str,
        *,
        pool_mode: str = "transaction",
        pool_size: int = 5,
    ) -> None:
        needed_for = "to run the job store behind PgBouncer (install it with .ci/infra.sh)"
        binary = shutil.which("pgbouncer") or next(
            (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None
        )
        if binary is None:
            unavailable("pgbouncer is not installed", needed_for)
        self.binary = binary
        self.server_port = server_port
        self.database = database
        self.pool_mode = pool_mode
        self.pool_size = pool_size
        self.dir = Path(tempfile.mkdtemp(prefix="ratchet-pgbouncer-"))
        self.prefix = as_user(self.dir, "postgres", needed_for)
        self.log = self.dir / "pgbouncer.log"
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    def _write_config(self) -> Path:
        users = self.dir / "users.txt"
        users.write_text('"postgres" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"{self.database} = host=127.0.0.1 port={self.server_port} dbname={self.database}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            f"pool_mode = {self.pool_mode}\n"
            f"default_pool_size = {self.pool_size}\n"
            "max_client_conn = 1000\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {self.log}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n"
        )
        for path in (users, ini):
            shutil.chown(path, *self._owner())
        return ini

    def _owner(self) -> tuple[int, int]:
        stat = self.dir.stat()
        return stat.st_uid, stat.st_gid

    def server_log(self) -> str:
        try:
            return self.log.read_text()[-4000:]
        except OSError:
            return ""

    def start(self) -> None:
        for _ in range(5):  # another process may take the free port before PgBouncer does
            self.port = free_port()
            ini = self._write_config()
            self.process = subprocess.Popen(
                [*self.prefix, self.binary, str(ini)],
                cwd=self.dir,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            if self._wait_listening():
                return
            self.stop()
        raise RuntimeError(f"PgBouncer did not start:\n{self.server_log()}")

    def _wait_listening(self, timeout: float = 30) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                return False
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        self.process = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


GALERA_PROVIDERS = ("/usr/lib/galera/libgalera_smm.so", "/usr/lib/libgalera_smm.so",
                    "/usr/lib64/galera-4/libgalera_smm.so")  # fmt: skip


class MariadbNode:
    """One private mariadbd: its own datadir and socket, its SQL port on 127.0.0.1, run as the
    ``mysql`` user; ``settings`` are lines added to its configuration."""

    def __init__(self, name: str, root: Path, mariadbd: str) -> None:
        self.name = name
        self.dir = root / name
        self.dir.mkdir()
        self.mariadbd = mariadbd
        self.data = self.dir / "data"
        self.log = self.dir / "error.log"
        self.socket = self.dir / "mysqld.sock"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}/"

    def settings(self) -> str:
        """Configuration lines of this kind of node, after the common ones."""
        return ""

    def write_config(self) -> Path:
        cnf = self.dir / "my.cnf"
        cnf.write_text(
            "[mariadbd]\n"
            f"datadir = {self.data}\n"
            f"socket = {self.socket}\n"
            f"pid-file = {self.dir / 'mariadbd.pid'}\n"
            f"log-error = {self.log}\n"
            f"port = {self.port}\n"
            "bind-address = 127.0.0.1\n"
            "skip-name-resolve\n"
            "user = mysql\n"
            "binlog_format = ROW\n"
            "default_storage_engine = InnoDB\n"
            "innodb_autoinc_lock_mode = 2\n"
            "innodb_flush_log_at_trx_commit = 0\n"
            "innodb_buffer_pool_size = 64M\n"
            "innodb_log_file_size = 48M\n"
            "max_connections = 300\n" + self.settings()
        )
        return cnf

    def install(self) -> None:
        command = ["mariadb-install-db", "--no-defaults", f"--datadir={self.data}",
                   "--user=mysql", "--auth-root-authentication-method=normal",
                   "--skip-test-db"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"mariadb-install-db failed:\n{done.stdout}{done.stderr}")

    def start(self, cnf: Path, *extra: str) -> None:
        self.process = subprocess.Popen(
            [self.mariadbd, f"--defaults-file={cnf}", *extra],
            cwd=self.dir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        """Run ``sql`` as root over the node's socket; [] while the node is not up yet."""
        import pymysql

        try:
            conn = pymysql.connect(unix_socket=str(self.socket), user="root", connect_timeout=5)
        except pymysql.err.OperationalError:
            return []
        try:
            with conn.cursor() as cursor:
                cursor.execute(sql)
                return list(cursor.fetchall())
        finally:
            conn.close()

    def status(self, name: str) -> str | None:
        rows = self.execute(f"SHOW STATUS LIKE '{name}'")
        return str(rows[0][1]) if rows else None

    def server_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)
        self.process = None


def _mariadbd(needed_for: str) -> str:
    """The mariadbd binary, after checking that mariadb-install-db is there too."""
    mariadbd = shutil.which("mariadbd") or shutil.which("mysqld")
    if mariadbd is None and Path("/usr/sbin/mariadbd").exists():
        mariadbd = "/usr/sbin/mariadbd"
    if shutil.which("mariadb-install-db") is None:
        unavailable("mariadb-install-db is not installed", needed_for)
    if mariadbd is None:
        unavailable("mariadbd is not installed", needed_for)
    return mariadbd


class PrivateMariaDB:
    """A lone private mariadbd, for tests that change a server's globals (``read_only``,
    ``max_allowed_packet``): never the shared server. Its job store is database ``ratchet``
    of user ``ratchet``, who has every right on that database and none on the server, so
    that ``read_only`` binds it (root may write through it)."""

    def __init__(self, root: Path | None = None) -> None:
        needed_for = "to run a private MariaDB server (install mariadb-server)"
        mariadbd = _mariadbd(needed_for)
        self.dir = Path(tempfile.mkdtemp(prefix="ratchet-mariadb-", dir=root))
        as_user(self.dir, "mysql", needed_for)
        self.node = MariadbNode("m1", self.dir, mariadbd)
        shutil.chown(self.node.dir, "mysql", "mysql")

    @property
    def url(self) -> str:
        return f"mysql://ratchet:ratchet@127.0.0.1:{self.node.port}/ratchet"

    def start(self, wait: Callable[[Callable[[], bool], float, str], None]) -> None:
        node = self.node
        node.install()
        node.start(node.write_config())
        wait(lambda: node.execute("SELECT 1") == [(1,)], 120, f"{node.name} to start")
        node.execute("CREATE DATABASE ratchet CHARACTER SET utf8mb4")
        node.execute("CREATE USER 'ratchet'@'127.0.0.1' IDENTIFIED BY 'ratchet'")
        node.execute("GRANT ALL ON ratchet.* TO 'ratchet'@'127.0.0.1'")

    def execute(self, sql: str) -> list[tuple[Any, ...]]:
        return self.node.execute(sql)

    def server_log(self) -> str:
        return self.node.server_log()

    def destroy(self) -> None:
        self.node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class GaleraNode(MariadbNode):
    """One mariadbd of a private Galera cluster: replication, IST and SST ports of its own
    on 127.0.0.1 besides its SQL port."""

    def __init__(self, name: str, root: Path, provider: str, mariadbd: str) -> None:
        super().__init__(name, root, mariadbd)
        self.provider = provider
        self.gcomm_port, self.ist_port, self.sst_port = (free_port() for _ in "123")
        self.members: list[GaleraNode] = [self]

    def settings(self) -> str:
        peers = ",".join(f"127.0.0.1:{m.gcomm_port}" for m in self.members if m is not self)
        return (
            "wsrep_on = ON\n"
            f"wsrep_provider = {self.provider}\n"
            "wsrep_cluster_name = ratchet_test\n"
            f"wsrep_cluster_address = gcomm://{peers}\n"
            f"wsrep_node_name = {self.name}\n"
            f"wsrep_node_address = 127.0.0.1:{self.gcomm_port}\n"
            f"wsrep_node_incoming_address = 127.0.0.1:{self.port}\n"
            f"wsrep_sst_receive_address = 127.0.0.1:{self.sst_port}\n"
            "wsrep_sst_method = rsync\n"
            f'wsrep_provider_options = "base_port={self.gcomm_port}; '
            f'ist.recv_addr=127.0.0.1:{self.ist_port}; gcache.size=32M"\n'
            "wsrep_slave_threads = 2\n"
        )

    def join(self, members: list[GaleraNode], *, new_cluster: bool = False) -> None:
        """Start the node as a member of ``members`` (the first one: a new cluster)."""
        self.members = members
        self.start(self.write_config(), *(["--wsrep-new-cluster"] if new_cluster else []))


class PrivateGalera:
    """Three (or ``size``) mariadbd nodes in one Galera cluster, the first bootstrapping it,
    the others joining by state transfer (rsync)."""

    def __init__(self, size: int = 3) -> None:
        needed_for = "to run a MariaDB Galera cluster (install galera-4 with .ci/infra.sh)"
        provider = next((p for p in GALERA_PROVIDERS if Path(p).exists()), None)
        if provider is None:
            unavailable("the Galera provider libgalera_smm.so (galera-4) is not installed",
                        needed_for)  # fmt: skip
        mariadbd = _mariadbd(needed_for)
        if shutil.which("rsync") is None:
            unavailable("rsync is not installed", needed_for)
        self.dir = Path(tempfile.mkdtemp(prefix="ratchet-galera-"))
        as_user(self.dir, "mysql", needed_for)
        self.nodes = [GaleraNode(f"g{i + 1}", self.dir, provider, mariadbd) for i in range(size)]
        for node in self.nodes:
            shutil.chown(node.dir, "mysql", "mysql")

    def logs(self) -> str:
        return "\n".join(f"--- {n.name}\n{n.server_log()}" for n in self.nodes)

    def start(self, wait: Callable[[Callable[[], bool], float, str], None]) -> None:
        first, *others = self.nodes
        first.install()
        first.join(self.nodes, new_cluster=True)
        wait(lambda: self.cluster_size(first) == 1, 120, f"{first.name} to bootstrap")
        first.execute("CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'")
        first.execute("GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION")
        for count, node in enumerate(others, start=2):
            node.data.mkdir()
            shutil.chown(node.data, "mysql", "mysql")
            node.join(self.nodes)
            wait(lambda n=node, c=count: self.synced(n) and self.cluster_size(first) == c,
                 240, f"{node.name} to join")  # fmt: skip

    def cluster_size(self, node: GaleraNode) -> int:
        value = node.status("wsrep_cluster_size")
        return int(value) if value else 0

    def synced(self, node: GaleraNode) -> bool:
        return node.status("wsrep_local_state_comment") == "Synced"

    def destroy(self) -> None:
        for node in reversed(self.nodes):
            node.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    """A redis-server of the test's own on a free port, keeping nothing on disk: a broker whose
    queues a test may fill, kill the consumers of, and empty, with no other run's keys in it."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            unavailable("redis-server is not installed (Debian: redis-server)", "a private Redis")
        self.directory = Path(tempfile.mkdtemp(prefix="ratchet-redis-"))
        self.port = free_port()
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn,
            ):
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    break
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.destroy()
                raise RuntimeError(f"the private redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def destroy(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)
        shutil.rmtree(self.directory, ignore_errors=True)
