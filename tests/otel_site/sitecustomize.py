"""OpenTelemetry's SDK in every process of the services under test (on their ``PYTHONPATH``): spans
go, as the SDK's console exporter writes them, one JSON document a line, to a file per process in
``$SQLQUEUE_TEST_SPANS``, for ``tests/test_airflow_services.py`` to read the traces back.

The provider is set before Airflow forks its task processes; a synchronous span processor, and a
file opened per process at each export, keep the spans of forked children whole and apart.
"""

from __future__ import annotations

import os


class _PerProcessFile:
    """A stream that appends each write to ``spans-<pid>.jsonl``: a forked child writes its own file."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def write(self, text: str) -> int:
        with open(os.path.join(self.folder, f"spans-{os.getpid()}.jsonl"), "a", encoding="utf-8") as file:
            return file.write(text)

    def flush(self) -> None:
        """Each write is flushed as it closes its file."""


def _configure(folder: str) -> None:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    provider = TracerProvider()
    exporter = ConsoleSpanExporter(out=_PerProcessFile(folder), formatter=lambda span: span.to_json(indent=None) + "\n")
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)


if os.environ.get("SQLQUEUE_TEST_SPANS"):
    _configure(os.environ["SQLQUEUE_TEST_SPANS"])
