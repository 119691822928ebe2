"""What Airflow's ProvidersManager reads about this provider (entry point ``apache_airflow_provider``)."""

from __future__ import annotations

from typing import Any

from . import __version__
from .transport import defaults

INTEGRATION = "SQL Queue"
PACKAGE = "airflow-provider-sqlqueue"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": PACKAGE,
        "name": "SQL Queue",
        "description": "Durable message queues in PostgreSQL and SQL Server tables, wire-compatible with "
        "NServiceBus's SQL transports; sensors, triggers and event-driven scheduling on them.",
        "versions": [__version__],
        "integrations": [
            # No external-doc-url: the documentation is the docs/ site built from this package's
            # repository, which has no public address of its own.
            {"integration-name": INTEGRATION, "tags": ["software"]}
        ],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": ["airflow_provider_sqlqueue.hooks.sqlqueue"]}],
        "operators": [
            {"integration-name": INTEGRATION, "python-modules": ["airflow_provider_sqlqueue.operators.sqlqueue"]}
        ],
        "sensors": [
            {"integration-name": INTEGRATION, "python-modules": ["airflow_provider_sqlqueue.sensors.sqlqueue"]}
        ],
        "triggers": [
            {"integration-name": INTEGRATION, "python-modules": ["airflow_provider_sqlqueue.triggers.sqlqueue"]}
        ],
        "connection-types": [
            {
                "connection-type": "sqlqueue",
                "hook-class-name": "airflow_provider_sqlqueue.hooks.sqlqueue.SqlQueueHook",
                "hook-name": "SQL Queue",
                "ui-field-behaviour": {
                    "hidden-fields": [],
                    "relabeling": {"schema": "Database name"},
                    "placeholders": {
                        "host": "database server, e.g. db.example.com",
                        "schema": "database name",
                        "port": "5432 (PostgreSQL) or 1433 (SQL Server)",
                    },
                },
                "conn-fields": {
                    "dialect": {
                        "label": "Database kind",
                        "description": "Which kind of database server holds the queue tables: PostgreSQL or SQL Server.",
                        "schema": {
                            "type": ["string", "null"],
                            "enum": ["postgres", "sqlserver", None],
                            "default": "postgres",
                        },
                    },
                    "error_queue": {
                        "label": "Error queue",
                        "description": "Queue that poison and failed messages are moved to (NServiceBus default: error).",
                        "schema": {"type": ["string", "null"], "default": defaults.ERROR_QUEUE},
                    },
                    "audit_queue": {
                        "label": "Audit queue",
                        "description": "Queue that acknowledged messages are copied to, with NServiceBus's processing "
                        "headers (NServiceBus default: audit); empty for no audit copies.",
                        "schema": {"type": ["string", "null"], "default": None},
                    },
                },
            }
        ],
        "cli": ["airflow_provider_sqlqueue.cli.airflow_commands"],
        "config": {
            "sqlqueue": {
                "description": "The SQL Queue provider's Queues page and queue metrics.",
                "options": {
                    "connections": {
                        "description": "Comma-separated connection ids the Queues page and the metrics look at besides "
                        "the metadata database's connections of type sqlqueue, postgres, mssql and odbc (connections "
                        "defined in the environment or a secrets backend cannot be listed otherwise).",
                        "version_added": None,
                        "type": "string",
                        "example": "shop_db,billing_db",
                        "default": "",
                    },
                    "health_metrics_interval": {
                        "description": "Seconds between the queue gauges (sqlqueue.waiting, sqlqueue.problems, "
                        "sqlqueue.horizon_age...) each triggerer sends for every connection its sqlqueue triggers "
                        "wait on, while Airflow's metrics are on; 0 sends none.",
                        "version_added": None,
                        "type": "float",
                        "example": "30",
                        "default": "60",
                    },
                },
            }
        },
        "queues": ["airflow_provider_sqlqueue.queues.sqlqueue.SqlQueueMessageQueueProvider"],
    }
