"""What tracing costs when nobody traces: send and receive throughput with the tracing code path in
place but OpenTelemetry absent or without a tracer provider, against a baseline, in one run.

Modes, measured in turns within each round (so that the machine's drift falls on all alike):

* ``baseline``: the operations' calls into :mod:`.transport.tracing` replaced by stubs that do
  nothing (a send's ``producing`` yields its messages, a receive's ``clock`` is 0): the library as
  if it had no tracing, short of removing the calls;
* ``absent``: the real code path with OpenTelemetry not importable (what a deployment without
  the ``otel`` extra runs);
* ``noop``: the real code path with OpenTelemetry's API installed and no tracer provider (the
  API's default, a no-op);
* ``sdk``: for information, an SDK tracer provider that records every span and exports none:
  what turning tracing on costs before any exporter.

Workloads: single sends, sends of 100, single receives, receives of 100 (``none`` mode), a 50-byte
JSON body; the queue for receives is filled with messages that carry a ``traceparent`` (as a
traced sender's do) so the receive side sees what it would parse. The figure is each mode's
messages/s over the baseline's in the same round; the table shows the median over rounds.

    .venv/bin/python bench/tracing.py --json bench/tracing.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import statistics
import sys
import time
import timeit
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient, ReceivedMessage, tracing
from bench.throughput import database

# The modules (the operations package's names are their functions).
claim_ops, delayed_ops, publish_ops, receive_ops, send_ops = (
    importlib.import_module(f"airflow_provider_sqlqueue.transport.operations.{name}")
    for name in ("claim", "delayed", "publish", "receive", "send")
)

BODY = b'{"order": 12345, "customer": "c-0001", "amount": 99.5}'[:50]
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
MODES = ("baseline", "absent", "noop", "sdk")
#: (name, messages per call, calls per turn of a mode)
WORKLOADS = (("send", 1, 200), ("send", 100, 20), ("receive", 1, 200), ("receive", 100, 20))


@contextlib.contextmanager
def _untraced(operation: str, destination: Any, messages: Sequence[Message], **_: Any) -> Iterator[Sequence[Message]]:
    yield messages


def _no_clock() -> int:
    return 0


def _nothing(*_: Any, **__: Any) -> None:
    return None


#: Where the operations hold the tracing functions they call, and the real ones.
PATCHED = [
    (send_ops, "producing", _untraced),
    (publish_ops, "producing", _untraced),
    (delayed_ops, "producing", _untraced),
    (receive_ops, "clock", _no_clock),
    (receive_ops, "consumed", _nothing),
    (claim_ops, "clock", _no_clock),
    (claim_ops, "consumed", _nothing),
]
REAL = [(module, name, getattr(module, name)) for module, name, _ in PATCHED]


def _reset_provider() -> None:
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()  # noqa: SLF001  # a benchmark switches providers within one process
    trace._TRACER_PROVIDER = None  # noqa: SLF001


def enter(mode: str) -> None:
    """Put the process in ``mode``."""
    for module, name, function in REAL:
        setattr(module, name, function)
    _reset_provider()
    tracing._otel, tracing._loaded = None, False  # noqa: SLF001  # loaded again by the next call
    if mode == "baseline":
        for module, name, stub in PATCHED:
            setattr(module, name, stub)
    elif mode == "absent":
        tracing._otel, tracing._loaded = None, True  # noqa: SLF001  # as if the import had failed
    elif mode == "sdk":
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider

        trace.set_tracer_provider(TracerProvider())  # records spans, exports none


def fill(uri: str, address: QueueAddress, count: int) -> None:
    """``count`` messages as a traced sender writes them (with a traceparent), by plain SQL."""
    headers = json.dumps({"NServiceBus.ContentType": "application/json", "traceparent": TRACEPARENT})
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{address.schema}"."{address.table}" (Id, Headers, Body) '
            "SELECT gen_random_uuid(), %s, %s FROM generate_series(1, %s)",
            (headers, BODY, count),
        )


def turns(client: QueueClient, address: QueueAddress, workload: tuple[str, int, int]) -> Iterator[Callable[[], None]]:
    """Callables that each make ``calls`` calls of the workload, their messages made before any clock starts."""
    name, per_call, calls = workload
    headers = {"NServiceBus.ContentType": "application/json"}
    while True:
        if name == "receive":

            def run() -> None:
                for _ in range(calls):
                    client.receive(address, per_call)

        else:  # new messages (new ids) for every call
            sends: list[Message | list[Message]] = [
                Message(BODY, headers) if per_call == 1 else [Message(BODY, headers) for _ in range(per_call)]
                for _ in range(calls)
            ]

            def run(sends: list[Message | list[Message]] = sends) -> None:
                for messages in sends:
                    client.send(address, messages)

        yield run


def measure(
    client: QueueClient, uri: str, address: QueueAddress, workload: tuple[str, int, int], chunks: int
) -> dict[str, tuple[float, float]]:
    """Each mode's messages/s (wall clock) and client CPU µs per message over ``chunks`` turns, the
    modes taking turns in a rotating order within each."""
    name, per_call, calls = workload
    wall = dict.fromkeys(MODES, 0.0)
    cpu = dict.fromkeys(MODES, 0.0)
    makers = turns(client, address, workload)
    for turn in range(chunks):
        client.purge(address)
        if name == "receive":
            fill(uri, address, per_call * calls * len(MODES))
        order = MODES[turn % len(MODES) :] + MODES[: turn % len(MODES)]
        for mode in order:
            run = next(makers)
            enter(mode)
            began, began_cpu = time.perf_counter(), time.process_time()
            run()
            wall[mode] += time.perf_counter() - began
            cpu[mode] += time.process_time() - began_cpu
            enter("baseline")
    count = per_call * calls * chunks
    return {mode: (count / wall[mode], cpu[mode] / count * 1e6) for mode in MODES}


def path_costs(number: int = 20_000) -> dict[str, dict[str, float]]:
    """What the tracing calls of one send and one receive cost by themselves (no database), per mode,
    in µs per call: a send's ``producing`` around 1 or 100 messages, a receive's ``clock`` and ``consumed``."""
    one = [Message(BODY)]
    hundred = [Message(BODY) for _ in range(100)]
    received = [ReceivedMessage(uuid.uuid4(), {"traceparent": TRACEPARENT}, BODY) for _ in range(100)]
    costs: dict[str, dict[str, float]] = {}
    for mode in ("baseline", "absent", "noop"):
        enter(mode)
        producing, clock, consumed = send_ops.producing, receive_ops.clock, receive_ops.consumed

        def send(messages: list[Message], producing: Any = producing) -> None:
            with producing("send", lambda: "bench@public", messages):
                pass

        def receive(messages: list[ReceivedMessage], clock: Any = clock, consumed: Any = consumed) -> None:
            consumed("receive", lambda: "bench@public", messages, clock())

        costs[mode] = {
            what: round(min(timeit.repeat(call, number=number, repeat=5)) / number * 1e6, 3)
            for what, call in (
                ("send x1", lambda: send(one)),
                ("send x100", lambda: send(hundred)),
                ("receive x1", lambda: receive(received[:1])),
                ("receive x100", lambda: receive(received)),
            )
        }
    enter("baseline")
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--uri", help="PostgreSQL URI (default: SQLQUEUE_BENCH_PG_URI, 127.0.0.1:5432/test)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=8, help="turns of the modes per round")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    rounds: dict[str, list[dict[str, tuple[float, float]]]] = {}
    with database(args.uri or os.environ.get("SQLQUEUE_BENCH_PG_URI")) as uri:
        schema = f"bench_tracing_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            address = QueueAddress("bench", schema)
            with QueueClient.connect(uri) as client:
                client.create_queue(address)
                for _ in range(args.rounds):
                    for workload in WORKLOADS:
                        key = f"{workload[0]} x{workload[1]}"
                        rounds.setdefault(key, []).append(measure(client, uri, address, workload, args.chunks))
        finally:
            enter("noop")
            with psycopg.connect(uri, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    result: dict[str, dict[str, dict[str, float]]] = {}
    for key, measured in rounds.items():
        result[key] = {}
        for mode in MODES:
            ratios = [m[mode][0] / m["baseline"][0] for m in measured]
            result[key][mode] = {
                "msg_per_s": round(statistics.median(m[mode][0] for m in measured)),
                "ratio": round(statistics.median(ratios), 3),
                "ratio_min": round(min(ratios), 3),
                "ratio_max": round(max(ratios), 3),
                "cpu_us_per_msg": round(statistics.median(m[mode][1] for m in measured), 2),
                "cpu_ratio": round(statistics.median(m[mode][1] / m["baseline"][1] for m in measured), 3),
            }
    print("msg/s (ratio to baseline) | client CPU µs per message (ratio), medians over rounds")
    print(f"{'workload':<13}" + "".join(f"{mode:>34}" for mode in MODES))
    for key, by_mode in result.items():
        cells = [
            f"{v['msg_per_s']:>7,} ({v['ratio']:.3f}) | {v['cpu_us_per_msg']:>6.1f} ({v['cpu_ratio']:.3f})"
            for v in by_mode.values()
        ]
        print(f"{key:<13}" + "".join(f"{cell:>34}" for cell in cells))
    paths = path_costs()
    print("the tracing calls alone, µs per send or receive call:", json.dumps(paths))
    if args.json:
        document = {"rounds": args.rounds, "chunks": args.chunks, "workloads": result, "path_us_per_call": paths}
        args.json.write_text(json.dumps(document, indent=2) + "\n")


if __name__ == "__main__":
    main()
