"""The Queues page's API inside Airflow's own api-server app, with real logins and real JWTs.

The app is ``airflow.api_fastapi.app.create_app()`` -- the api-server's, with the provider's
plugin mounted by Airflow's plugin manager -- driven through FastAPI's test client. Users log in
with passwords at ``/auth/token`` (the simple auth manager's login); connection permissions come
from :class:`tests.airflow_auth.PerConnectionAuthManager`, so every answer an auth manager can
give is tried: none (401), no access (403), read only, read and edit. Figures are compared with
the tables, actions with what they moved.
"""

from __future__ import annotations

import json
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta

import psycopg
import pytest

from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from demo.services import airflow_connection

USERS = {"viewer": "viewer", "reader": "reader", "operator": "operator"}


class Api:
    def __init__(self, http, schema: str, pg_uri: str) -> None:
        self.http = http
        self.schema = schema
        self.pg_uri = pg_uri
        self.tokens: dict[str, str] = {}

    def token(self, user: str) -> str:
        if user not in self.tokens:
            answer = self.http.post("/auth/token", json={"username": user, "password": USERS[user]})
            assert answer.status_code == 201, answer.text
            self.tokens[user] = answer.json()["access_token"]
        return self.tokens[user]

    def get(self, user: str | None, path: str, **params):
        headers = {} if user is None else {"Authorization": f"Bearer {self.token(user)}"}
        return self.http.get(f"/sqlqueue/api{path}", params=params, headers=headers)

    def post(self, user: str | None, path: str, body: dict):
        headers = {} if user is None else {"Authorization": f"Bearer {self.token(user)}"}
        return self.http.post(f"/sqlqueue/api{path}", json=body, headers=headers)


@contextmanager
def served(settings: dict[str, str], schema: str, pg_uri: str, patch: pytest.MonkeyPatch) -> Iterator[Api]:
    """The api-server's app under ``settings`` (set in the environment through ``patch``, which
    restores it), over the queues of ``schema``, which is dropped afterwards."""
    from airflow.api_fastapi.app import create_app, purge_cached_app
    from fastapi.testclient import TestClient

    for key, value in settings.items():
        patch.setenv(key, value)
    purge_cached_app()
    try:
        with TestClient(create_app()) as http:
            yield Api(http, schema, pg_uri)
    finally:
        purge_cached_app()
        with QueueClient.connect(pg_uri) as installer:
            installer.session.connection.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(scope="module")
def api(airflow_db: str, pg_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    from airflow.models.connection import Connection
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    schema = f"api_{uuid.uuid4().hex[:8]}"
    with QueueClient.connect(pg_uri) as installer:
        installer.session.connection.execute(f'CREATE SCHEMA "{schema}"')
        for name in ("orders", "billing"):
            installer.create_queue(QueueAddress(name, schema))
    passwords = tmp_path_factory.mktemp("auth") / "passwords.json"
    passwords.write_text(json.dumps(USERS))
    grants = {
        "reader": {"shop": ["GET"]},
        "operator": {"shop": ["GET", "PUT"], "other": ["GET", "PUT"], "stored_shop": ["GET"], "stored_http": ["GET"]},
    }
    settings = {
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.airflow_auth.PerConnectionAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{user}:viewer" for user in USERS),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),  # whatever ran before in this process
        "AIRFLOW__SQLQUEUE__CONNECTIONS": "shop,other",
        "AIRFLOW_CONN_SHOP": airflow_connection(pg_uri),
        "AIRFLOW_CONN_OTHER": airflow_connection(pg_uri),
        "SQLQUEUE_TEST_GRANTS": json.dumps(grants),
    }
    stored = [("stored_shop", "postgres"), ("stored_http", "http")]  # in the metadata database: one holds queues
    with create_session() as session:
        session.execute(delete(Connection).where(Connection.conn_id.in_([name for name, _ in stored])))
        for name, conn_type in stored:
            session.add(Connection(conn_id=name, conn_type=conn_type, host="localhost"))
    with pytest.MonkeyPatch.context() as patch, served(settings, schema, pg_uri, patch) as api:
        yield api


def address(api: Api, name: str) -> str:
    return f'{name}@"{api.schema}"'


def test_the_page_and_its_files_are_served_with_a_strict_policy(api: Api) -> None:
    page = api.http.get("/sqlqueue/")
    assert page.status_code == 200 and "<title>Queues</title>" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert api.http.get("/sqlqueue/static/queues.js").status_code == 200
    assert api.http.get("/sqlqueue/static/..%2F..%2Fsqlqueue.py").status_code == 404


def test_the_navigation_lists_the_queues_page(api: Api) -> None:
    answer = api.http.get("/api/v2/plugins", headers={"Authorization": f"Bearer {api.token('operator')}"})
    assert answer.status_code == 200, answer.text
    views = [view for plugin in answer.json()["plugins"] for view in plugin.get("external_views", [])]
    assert {"name": "Queues", "href": "/sqlqueue/", "url_route": "sqlqueue"}.items() <= next(
        view for view in views if view["name"] == "Queues"
    ).items()


def test_anonymous_callers_are_refused(api: Api) -> None:
    assert api.get(None, "/connections").status_code == 401
    assert api.get(None, "/connections/shop/queues").status_code == 401
    assert api.post(None, "/connections/shop/purge-expired", {"queue": "orders"}).status_code == 401


#: The connections these tests define (others' may be stored in the shared metadata database).
OWN_CONNECTIONS = {"other", "shop", "stored_shop", "stored_http"}


def listed(api: Api, user: str) -> dict[str, tuple[str, bool, bool]]:
    return {
        c["connection_id"]: (c["conn_type"], c["may_read_messages"], c["may_act"])
        for c in api.get(user, "/connections").json()
        if c["connection_id"] in OWN_CONNECTIONS
    }


def test_each_user_sees_the_connections_they_may_read(api: Api) -> None:
    # Every user here has the simple auth manager's viewer role, which may view Browse > Jobs: each watches
    # every queue connection (no http connection); reading messages and acting follow the connection grants.
    kinds = {"other": "configured", "shop": "configured", "stored_shop": "postgres"}
    assert listed(api, "viewer") == {conn: (kind, False, False) for conn, kind in kinds.items()}
    assert listed(api, "reader") == {**listed(api, "viewer"), "shop": ("configured", True, False)}
    grants = {"other": (True, True), "shop": (True, True), "stored_shop": (True, False)}
    assert listed(api, "operator") == {conn: (kinds[conn], *grants[conn]) for conn in kinds}


def test_a_user_without_access_to_the_connection_is_refused(api: Api) -> None:
    assert api.get("viewer", "/connections/shop/queues").status_code == 200  # watching: figures only
    for user, conn in (("viewer", "shop"), ("reader", "other")):
        refused = api.get(user, f"/connections/{conn}/errors/messages", error_queue="error")
        assert refused.status_code == 403 and "needs read access to the connection" in refused.json()["detail"]
    refused = api.get("reader", "/connections/stored_http/queues")  # not a queue connection: no watching
    assert refused.status_code == 403 and "needs read access to the connection" in refused.json()["detail"]


def test_figures_match_the_tables(api: Api) -> None:
    orders = QueueAddress("orders", api.schema)
    with QueueClient.connect(api.pg_uri) as client:
        client.send(orders, [Message(f"m{n}") for n in range(7)])
        claimed = client.claim(orders, 2, lease=timedelta(minutes=5))
        expected = client.queue_stats(orders)[0]
        try:
            page = api.get("reader", "/connections/shop/queues", search=api.schema, limit=200).json()
            figures = {q["address"]: q for q in page["queues"]}
            mine = figures[address(api, "orders")]
            assert (mine["waiting"], mine["in_flight"], mine["lapsed"], mine["expired"]) == (5, 2, 0, 0)
            assert mine["waiting"] == expected.waiting and mine["kind"] == "queue"
            assert figures[address(api, "error")]["kind"] == "error"
            assert address(api, "error") in page["error_queues"]
            exact = api.get("reader", "/connections/shop/depth", queue=address(api, "orders")).json()
            assert exact == {"queue": address(api, "orders"), "count": client.depth(orders)}
            claims = api.get("reader", "/connections/shop/claims", queue=address(api, "orders")).json()
            assert len(claims) == 2 and all("token" not in claim for claim in claims)
        finally:
            client.purge(orders)
            client.ack(orders, [message.claim_token for message in claimed])


def test_paging_and_searching_queues(api: Api) -> None:
    first = api.get("reader", "/connections/shop/queues", search=api.schema, limit=1).json()
    second = api.get("reader", "/connections/shop/queues", search=api.schema, limit=1, offset=1).json()
    assert first["total"] == second["total"] == 3  # billing, error, orders
    assert first["queues"][0]["address"] != second["queues"][0]["address"]
    assert api.get("reader", "/connections/shop/queues", limit=10_000).status_code == 422


def test_a_page_without_the_error_queue_that_holds_failures_says_them_with_the_databases_problems(api: Api) -> None:
    """A page's queues are looked at with their error queues: one off the page (paging, a search)
    that holds failures is said with the database's problems, not a 500 for its missing row."""
    import psycopg

    orders = QueueAddress("orders", api.schema)
    with QueueClient.connect(api.pg_uri) as client:
        client.send(orders, Message("to fail"))
        [claimed] = client.claim(orders, 1)
        client.fail(orders, claimed, ValueError("no price"))
    try:
        page = api.get("reader", "/connections/shop/queues", search=api.schema, limit=1)  # billing alone
        assert page.status_code == 200, page.text
        assert [q["address"] for q in page.json()["queues"]] == [address(api, "billing")]
        assert any(p.startswith(f"{address(api, 'error')}: about 1 failed") for p in page.json()["problems"])
    finally:
        with psycopg.connect(api.pg_uri, autocommit=True) as raw:
            raw.execute(f'DELETE FROM "{api.schema}"."error"')


def test_a_reader_cannot_act_and_an_operator_can(api: Api) -> None:
    orders = QueueAddress("orders", api.schema)
    error = address(api, "error")
    with QueueClient.connect(api.pg_uri) as client:
        client.send(orders, Message("to fail"))
        [failing] = client.claim(orders)
        client.fail(orders, failing, ValueError("no"))
        client.send(orders, Message("x"))
        [lapsing] = client.claim(orders, lease=timedelta(milliseconds=1))
        client.send(orders, Message("expired", time_to_be_received=timedelta(milliseconds=1)))
        target = {"queue": address(api, "orders")}
        source = {"error_queue": error, "source": address(api, "orders")}
        try:
            for path, body in (
                ("/connections/shop/purge-expired", target),
                ("/connections/shop/release-lapsed", target),
                ("/connections/shop/errors/retry", source),
            ):
                assert api.post("reader", path, body).status_code == 403
                assert api.post("viewer", path, body).status_code == 403
            assert (
                client.depth(orders),
                client.in_flight(orders),
                client.depth(QueueAddress("error", api.schema)),
            ) == (
                1,
                1,
                1,
            )

            assert api.post("operator", "/connections/shop/purge-expired", target).json()["count"] == 1
            assert api.post("operator", "/connections/shop/release-lapsed", target).json()["count"] == 1
            assert api.post("operator", "/connections/shop/release-lapsed", target).json()["count"] == 0
            assert [m.id for m in client.browse(orders)] == [lapsing.id]
            summary = api.get("reader", "/connections/shop/errors", error_queue=error).json()
            assert [(g["source"], g["count"]) for g in summary["groups"]] == [(address(api, "orders"), 1)]
            page = api.get("reader", "/connections/shop/errors/messages", error_queue=error).json()
            [failure] = page["failures"]
            assert (failure["id"], failure["body_preview"], failure["body_encoding"]) == (
                str(failing.id),
                "to fail",
                "text",
            )
            assert failure["exception_type"] == "builtins.ValueError" and page["next_before"] is None
            # Times as every time shown: ISO 8601 in UTC (the page shows them in the viewer's zone).
            [group] = summary["groups"]
            for shown in (failure["time_of_failure"], group["newest_failure"]):
                assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", shown), shown
            retry = {"error_queue": error, "seqs": [failure["seq"]]}
            assert api.post("operator", "/connections/shop/errors/retry", retry).json()["retried"] == 1
            assert api.post("operator", "/connections/shop/errors/retry", retry).json()["retried"] == 0
            assert api.post("operator", "/connections/shop/errors/retry", source).json() == {
                "retried": 0,
                "after": 0,
                "done": True,
                "skipped": [],
            }
            assert [m.text for m in client.browse(orders)] == ["x", "to fail"]
            client.send(orders, Message("due"), delay=0.001)
            time.sleep(0.05)
            assert api.post("reader", "/connections/shop/move-due", target).status_code == 403
            assert api.post("operator", "/connections/shop/move-due", target).json() == {**target, "count": 1}
            assert [m.text for m in client.browse(orders)] == ["x", "to fail", "due"]
        finally:
            client.purge(orders)


def test_bad_input_gets_the_librarys_message(api: Api) -> None:
    assert api.get("reader", "/connections/shop/depth", queue=f'missing@"{api.schema}"').status_code == 404
    assert api.get("reader", "/connections/shop/depth", queue="a.b.c").status_code == 400
    answer = api.post("operator", "/connections/shop/errors/retry", {"error_queue": "error"})
    assert answer.status_code == 400 and "either source" in answer.json()["detail"]
    answer = api.post("operator", "/connections/shop/errors/retry", {"error_queue": "error", "seqs": [0]})
    assert answer.status_code in (400, 422)


def test_actions_are_in_airflows_audit_log(api: Api) -> None:
    from airflow.models.log import Log
    from airflow.utils.session import create_session
    from sqlalchemy import select

    api.post("operator", "/connections/shop/purge-expired", {"queue": address(api, "billing")})
    with create_session() as session:
        rows = session.scalars(select(Log).where(Log.event == "sqlqueue.purge_expired")).all()
    assert any(row.owner == "operator" and json.loads(row.extra)["queue"] == address(api, "billing") for row in rows)


def test_a_page_of_failures_bounds_every_header(api: Api) -> None:
    """A failed message with a 2 MB header (and one holding a lone surrogate) made a 2 MB answer."""
    error = QueueAddress("error", api.schema)
    with QueueClient.connect(api.pg_uri) as client:
        client.send(
            error,
            Message("huge", {"NServiceBus.FailedQ": address(api, "orders"), "Custom.Trace": "t" * 2_000_000}),
        )
        try:
            answer = api.get("operator", "/connections/shop/errors/messages", error_queue=address(api, "error"))
            assert answer.status_code == 200, answer.text
            assert len(answer.content) < 100_000
            [huge] = [f for f in answer.json()["failures"] if f["body_preview"] == "huge"]
            assert huge["headers"]["Custom.Trace"].endswith("characters cut)")
        finally:
            client.purge(error)


def test_a_retry_answers_which_messages_it_left_and_why(api: Api) -> None:
    """A failure whose FailedQ is a business table used to fail the whole retry with a 500."""
    error = QueueAddress("error", api.schema)
    with QueueClient.connect(api.pg_uri) as client:
        client.session.connection.execute(f'CREATE TABLE IF NOT EXISTS "{api.schema}".ledger (Id int, Amount int)')
        client.send(error, Message("misrouted", {"NServiceBus.FailedQ": address(api, "ledger")}))
        client.send(error, Message("fine", {"NServiceBus.FailedQ": address(api, "billing")}))
        try:
            body = {"error_queue": address(api, "error"), "source": address(api, "billing")}
            answer = api.post("operator", "/connections/shop/errors/retry", body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["retried"] == 1
            seqs = [m.seq for m in client.failed_messages(error)[0]]
            answer = api.post(
                "operator", "/connections/shop/errors/retry", {"error_queue": address(api, "error"), "seqs": seqs}
            )
            assert answer.status_code == 200, answer.text
            [left] = answer.json()["skipped"]
            assert "not a queue table" in left["reason"] and answer.json()["retried"] == 0
            assert [m.text for m in client.receive(QueueAddress("billing", api.schema), 5)] == ["fine"]
        finally:
            client.purge(error)


def test_problems_come_first_with_the_horizon_holder_named(api: Api) -> None:
    import psycopg

    billing = QueueAddress("billing", api.schema)
    with QueueClient.connect(api.pg_uri) as client, psycopg.connect(api.pg_uri) as pin:
        client.send(billing, Message("late"), delay=0.001)
        client.session.connection.execute(
            f'UPDATE "{api.schema}"."billing.Delayed" SET Due = Due - interval \'2 minutes\''
        )
        pin.execute("SET application_name = 'page-health-pin'")
        pin.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        pin.execute("SELECT 1")
        try:
            page = api.get("reader", "/connections/shop/queues", search=api.schema, limit=200).json()
        finally:
            pin.rollback()
            client.move_due(billing)
            client.purge(billing)
    names = [q["address"] for q in page["queues"]]
    assert names[0] == address(api, "billing")  # the one queue with a problem, first (by name it is not)
    first = page["queues"][0]
    assert (first["due_delayed"], first["overdue_seconds"] >= 120) == (1, True)
    assert any("delayed message(s) due for 2 min" in text for text in first["problems"])
    assert page["queues"][names.index(address(api, "orders"))]["problems"] == []
    holders = {h["application"]: h for h in page["horizon"]["holders"]}
    assert holders["page-health-pin"]["state"] == "idle in transaction" and page["horizon"]["complete"]
    assert holders["page-health-pin"]["held_seconds"] >= 0


def test_a_connection_with_no_slot_free_gets_a_503_that_says_so_and_the_page_recovers(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database's connections exhausted (here a role's CONNECTION LIMIT, as max_connections
    would be): the page's API answers 503 with the library's words naming the limit, not a 500,
    and answers again as soon as a slot is free."""
    from psycopg.conninfo import make_conninfo

    role = f"sq_limit_{uuid.uuid4().hex[:8]}"
    with QueueClient.connect(api.pg_uri) as admin:
        admin.session.connection.execute(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 1')
        admin.session.connection.execute(f'GRANT USAGE ON SCHEMA "{api.schema}" TO "{role}"')
        admin.session.connection.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA "{api.schema}" TO "{role}"')
    limited = make_conninfo(api.pg_uri, user=role)
    monkeypatch.setenv("AIRFLOW_CONN_OTHER", airflow_connection(limited))
    try:
        with QueueClient.connect(limited):  # the role's one slot
            refused = api.get("operator", "/connections/other/queues", search=api.schema)
        assert refused.status_code == 503, refused.text
        assert "no connection slot free" in refused.json()["detail"], refused.text
        answered = api.get("operator", "/connections/other/queues", search=api.schema)
        assert answered.status_code == 200, answered.text
        assert address(api, "orders") in {q["address"] for q in answered.json()["queues"]}
    finally:
        with QueueClient.connect(api.pg_uri) as admin:
            admin.session.connection.execute(f'DROP OWNED BY "{role}"')
            admin.session.connection.execute(f'DROP ROLE "{role}"')


def test_a_journey_follows_a_trace_for_a_reader_and_is_refused_to_a_watcher(api: Api) -> None:
    trace = uuid.uuid4().hex  # a trace of this test's own: the connection's other queues hold none of it
    orders, billing, audit = (QueueAddress(name, api.schema) for name in ("orders", "billing", "audit"))
    with QueueClient.connect(api.pg_uri, error_queue=QueueAddress("error", api.schema), audit_queue=audit) as client:
        client.create_queue(audit)
        outside = Message("order", {"traceparent": f"00-{trace}-00f067aa0ba902b7-01", "Custom.Big": "b" * 100_000})
        client.send(orders, outside)
        [claim] = client.claim(orders, 1)
        result = Message("invoice", {"traceparent": f"00-{trace}-b7ad6b7169203331-01"})
        client.forward({orders: [claim.claim_token]}, {billing: [result]})
        [held] = client.claim(billing, 1)
        client.fail(billing, held, ValueError("no such customer " + "x" * 100_000))
        try:
            answer = api.get("reader", "/connections/shop/journey", id=trace.upper())
            assert answer.status_code == 200, answer.text
            found = answer.json()
            assert len(answer.content) < 50_000  # every header value bounded
            assert (found["kind"], found["key"]) == ("trace", trace)
            processed, failed = found["sightings"]
            assert (processed["message_id"], processed["station"], processed["stage"]) == (
                str(outside.id),
                "processed",
                "orders",
            )
            assert processed["table"] == address(api, "audit") and processed["trace_id"] == trace
            assert processed["parent_span_id"] == "00f067aa0ba902b7" and processed["processing_seconds"] >= 0
            assert (failed["message_id"], failed["station"], failed["stage"]) == (
                str(result.id),
                "failed",
                address(api, "billing"),
            )
            assert "no such customer" in failed["exception"] and failed["exception"].endswith("characters cut)")
            for shown in (processed["sent"], processed["started"], failed["ended"]):
                assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", shown), shown
            mine = api.get("reader", "/connections/shop/journey", id=str(outside.id)).json()
            assert mine["kind"] == "message" and mine["trace_ids"] == [trace]
            with psycopg.connect(api.pg_uri) as migration:  # a table locked past the lock wait: named, left out
                migration.execute(f'LOCK TABLE "{api.schema}"."billing" IN ACCESS EXCLUSIVE MODE')
                held = api.get("reader", "/connections/shop/journey", id=trace).json()
            assert address(api, "billing") in held["locked"], held
            assert [s["station"] for s in held["sightings"]] == ["processed", "failed"]  # audit and error

            refused = api.get("viewer", "/connections/shop/journey", id=trace)  # figures only: no headers
            assert refused.status_code == 403 and "needs read access to the connection" in refused.json()["detail"]
            for bad in ("orders", "0" * 32, "' OR 1=1 --", ""):
                answer = api.get("reader", "/connections/shop/journey", id=bad)
                assert answer.status_code == 400 and "trace id" in answer.json()["detail"], (bad, answer.text)
            assert api.get("reader", "/connections/shop/journey", id="x" * 201).status_code == 422
            assert api.get("reader", "/connections/shop/journey", id=trace, scan=0).status_code == 422
        finally:
            client.drop_queue(audit)
            client.purge(QueueAddress("error", api.schema))
            client.purge(billing)
