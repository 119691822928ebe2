"""airflow-provider-sqlqueue: database tables as durable message queues, for Airflow and beyond.

The :mod:`airflow_provider_sqlqueue.transport` package is the queue itself and imports nothing
from Airflow; the Airflow integration lives beside it.
"""

__version__ = "0.1.0"
