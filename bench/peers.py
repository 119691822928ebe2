"""The peers the benchmarks measure beside this package: PgQueuer and PGMQ, installed for a run only.

Neither is a dependency of this project: ``bash bench/run`` runs the scripts that use them with
``uv run --with pgqueuer==... --with asyncpg --with pgmq==...``; without them a script skips their
rows and prints why (:func:`missing`).

* PgQueuer runs on asyncpg, its own first-choice driver; its tables go into a fresh schema of the
  bench's (:func:`pgqueuer_queries` sets the search_path, :func:`install_pgqueuer` installs).
* PGMQ is SQL on plain PostgreSQL: the ``pgmq.sql`` that the ``pgmq`` Python package ships,
  executed as one script (as ``psql -f`` would) into the schema ``pgmq``, which every statement of
  PGMQ names (:func:`install_pgmq`, :func:`pgmq_installed`).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import import_module
from pathlib import Path
from typing import Any

import psycopg

PGMQ_SCHEMA = "pgmq"  # PGMQ's SQL names its schema in every statement
PEERS = ("pgqueuer", "pgmq")


def pgmq_sql() -> Path | None:
    """The install script the ``pgmq`` package ships (``pgmq/sql/pgmq.sql``), if it is installed."""
    try:
        distribution = importlib.metadata.distribution("pgmq")
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(str(distribution.locate_file("pgmq/sql/pgmq.sql")))
    return path if path.is_file() else None


def versions() -> dict[str, str | None]:
    """The peers' package versions, and the version of the PGMQ SQL that the pgmq package ships."""
    found: dict[str, str | None] = {}
    for name in ("pgqueuer", "asyncpg", "pgmq"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    sql = pgmq_sql()
    version_file = sql.with_name("VERSION") if sql else None
    found["pgmq_sql"] = version_file.read_text().strip() if version_file and version_file.is_file() else None
    return found


def missing(peer: str) -> str | None:
    """Why a peer's rows cannot run here (its package is not installed), or None."""
    if peer == "pgqueuer":
        for name in ("pgqueuer", "asyncpg"):
            if importlib.util.find_spec(name) is None:
                return f"{name} is not installed (bash bench/run adds it with uv run --with)"
    if peer == "pgmq" and pgmq_sql() is None:
        return "the pgmq package (whose pgmq.sql is installed for the run) is not installed (bash bench/run adds it with uv run --with)"
    return None


async def pgqueuer_queries(uri: str, schema: str) -> tuple[Any, Any]:
    """An asyncpg connection whose search_path is ``schema`` and PgQueuer's ``Queries`` on it."""
    asyncpg = import_module("asyncpg")
    pgqueuer = import_module("pgqueuer")
    connection = await asyncpg.connect(uri, server_settings={"search_path": schema})
    return connection, pgqueuer.Queries(pgqueuer.AsyncpgDriver(connection))


async def install_pgqueuer(uri: str, schema: str) -> None:
    """PgQueuer's tables, functions and trigger in ``schema`` (which exists)."""
    connection, queries = await pgqueuer_queries(uri, schema)
    try:
        await queries.install()
    finally:
        await connection.close()


def install_pgmq(raw: psycopg.Connection[Any]) -> None:
    """PGMQ's SQL, into the schema ``pgmq`` (created by the script when missing)."""
    sql = pgmq_sql()
    if sql is None:
        raise RuntimeError(missing("pgmq"))
    raw.execute(sql.read_bytes())  # no parameters: sent as one script, as psql -f would


@contextmanager
def pgmq_installed(uri: str) -> Iterator[str]:
    """PGMQ installed in this database for the block; yields ``"installed"`` or ``"existing"``.

    A ``pgmq`` schema already there (someone else's install) is used as it is and left in place;
    one this block installed is dropped at its end.
    """
    with psycopg.connect(uri, autocommit=True) as raw:
        if raw.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [PGMQ_SCHEMA]).fetchone():
            yield "existing"
            return
        try:
            install_pgmq(raw)
            yield "installed"
        finally:
            raw.execute(f'DROP SCHEMA IF EXISTS "{PGMQ_SCHEMA}" CASCADE')
