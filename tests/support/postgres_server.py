"""A throwaway PostgreSQL server on 127.0.0.1 for tests and benchmarks: Debian's ``postgresql``
package (``make setup`` installs it when run as root); as root the server runs as the
``postgres`` user, which PostgreSQL requires. Password (scram) authentication, no fsync."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

USER, PASSWORD = "llmrubric", "scale-test"


def binaries() -> str | None:
    """The directory of ``initdb``/``pg_ctl``, or None."""
    found = shutil.which("pg_ctl")
    candidates = ([os.path.dirname(os.path.realpath(found))] if found else []) + sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), reverse=True
    )
    return next((d for d in candidates if os.path.isfile(os.path.join(d, "initdb"))), None)


def unavailable() -> str:
    """Why no server can be started here ('' if one can)."""
    if binaries() is None:
        return (
            "no PostgreSQL server binaries (initdb, pg_ctl): run `make setup` as root, or install Debian's postgresql"
        )
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[scale]')"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without a 'postgres' user to run the server as"
    return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """``with PostgresServer() as pg: pg.create_database("x"); pg.url("x")``."""

    def __init__(self):
        self.bin = binaries()
        self.port = free_port()
        self.prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *args: str) -> None:
        subprocess.run(self.prefix + list(args), check=True, capture_output=True, text=True, cwd=self.dir)

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="llmrubric-pg-")
        os.chmod(self.dir, 0o755)
        if self.prefix:
            shutil.chown(self.dir, "postgres", "postgres")
        pwfile = os.path.join(self.dir, "pw")
        with open(pwfile, "w") as f:
            f.write(PASSWORD)
        if self.prefix:
            shutil.chown(pwfile, "postgres", "postgres")
        data = os.path.join(self.dir, "data")
        self._run(
            f"{self.bin}/initdb", "-D", data, "-U", USER, f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8"
        )
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run(f"{self.bin}/pg_ctl", "-D", data, "-l", os.path.join(self.dir, "log"), "-o", options, "-w", "start")
        self.data = data
        return self

    def __exit__(self, *exc):
        subprocess.run(
            self.prefix + [f"{self.bin}/pg_ctl", "-D", self.data, "-m", "immediate", "stop"],
            capture_output=True,
            cwd=self.dir,
        )
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, database: str, password: str = PASSWORD) -> str:
        return f"postgresql+psycopg2://{USER}:{password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg2

        connection = psycopg2.connect(host="127.0.0.1", port=self.port, user=USER, password=PASSWORD, dbname="postgres")
        connection.autocommit = True
        with connection.cursor() as cursor:
            cursor.execute(f'CREATE DATABASE "{name}"')
        connection.close()
        return self.url(name)
