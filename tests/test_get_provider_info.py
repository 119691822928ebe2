"""Provider registration: what Airflow sees of the provider (:mod:`airflow_provider_sqlqueue.get_provider_info`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import airflow
import jsonschema
import pytest

from airflow_provider_sqlqueue.get_provider_info import get_provider_info


def test_provider_info_matches_airflows_schema():
    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    assert info["queues"] == ["airflow_provider_sqlqueue.queues.sqlqueue.SqlQueueMessageQueueProvider"]


def test_the_integration_links_to_no_other_projects_documentation() -> None:
    """The docs are this repository's own site, which has no public address: no link is given
    rather than another project's (NServiceBus's) or an address nobody serves."""
    [integration] = get_provider_info()["integrations"]
    assert "external-doc-url" not in integration


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("list", "airflow-provider-sqlqueue"),
        ("hooks", "airflow_provider_sqlqueue.hooks.sqlqueue.SqlQueueHook"),
        ("triggers", "airflow_provider_sqlqueue.triggers.sqlqueue"),
        ("widgets", "extra__sqlqueue__error_queue"),
        ("queues", "SqlQueueMessageQueueProvider"),
    ],
)
def test_airflow_cli_lists_the_provider(command, expected):
    result = subprocess.run(
        [sys.executable, "-m", "airflow", "providers", command, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert expected in result.stdout


def test_message_queue_provider_is_registered():
    from airflow.providers_manager import ProvidersManager

    manager = ProvidersManager()
    manager.initialize_providers_queues()
    assert "airflow_provider_sqlqueue.queues.sqlqueue.SqlQueueMessageQueueProvider" in manager.queue_class_names


def test_each_connection_form_field_has_a_label_of_its_own():
    from airflow_provider_sqlqueue.get_provider_info import get_provider_info

    [connection_type] = get_provider_info()["connection-types"]
    behaviour = connection_type["ui-field-behaviour"]
    standard = {"host": "Host", "schema": "Schema", "login": "Login", "password": "Password", "port": "Port"}
    labels = [
        behaviour["relabeling"].get(field, label)
        for field, label in standard.items()
        if field not in behaviour["hidden-fields"]
    ]
    labels += [field["label"] for field in connection_type["conn-fields"].values()]
    assert len(labels) == len(set(labels)), labels
