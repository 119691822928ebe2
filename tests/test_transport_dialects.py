"""Choosing a dialect by name (:mod:`airflow_provider_sqlqueue.transport.dialects`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from airflow_provider_sqlqueue.transport.dialects import get_dialect
from airflow_provider_sqlqueue.transport.errors import InvalidArgumentError


@pytest.mark.parametrize(
    ("name", "dialect"),
    [
        ("postgres", "postgres"),
        ("PostgreSQL", "postgres"),
        ("pg", "postgres"),
        ("sqlserver", "sqlserver"),
        ("MSSQL", "sqlserver"),
    ],
)
def test_each_name_of_a_database_chooses_its_dialect(name: str, dialect: str) -> None:
    assert get_dialect(name).name == dialect


def test_an_unknown_dialect_is_refused() -> None:
    with pytest.raises(InvalidArgumentError, match="unknown SQL dialect 'oracle'"):
        get_dialect("oracle")


def test_postgresql_users_never_load_sql_servers_dialect() -> None:
    probe = (
        "import sys\n"
        "from airflow_provider_sqlqueue.transport.dialects import get_dialect\n"
        "get_dialect('postgres')\n"
        "print('airflow_provider_sqlqueue.transport.dialects.sqlserver' in sys.modules)\n"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert loaded.stdout.strip() == "False"
