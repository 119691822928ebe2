"""Unit behaviour of :mod:`airflow_provider_sqlqueue.transport`: its names, loaded on first use, with no Airflow import."""

from __future__ import annotations

import subprocess
import sys

import pytest

import airflow_provider_sqlqueue.transport as transport


def test_every_exported_name_resolves_to_its_home() -> None:
    for name in transport.__all__:
        assert getattr(transport, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        transport.Nothing  # noqa: B018  # the lookup is the test


def test_a_small_module_loads_alone_and_nothing_loads_airflow() -> None:
    code = (
        "import sys; import airflow_provider_sqlqueue.transport.defaults; "
        "assert 'airflow_provider_sqlqueue.transport.client' not in sys.modules; "
        "from airflow_provider_sqlqueue.transport import QueueClient, MessagePump; "
        "assert not [m for m in sys.modules if m == 'airflow' or m.startswith('airflow.')], 'airflow imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
