"""Who may do what on the Queues page (issue 35): watching, reading messages, acting.

Inside Airflow's own api-server app (as ``tests/test_plugins_sqlqueue.py``), with an auth manager
that grants Airflow's view permissions per user as well as connection permissions, so a user can
lack the monitoring view (Browse > Jobs), which every role of the simple auth manager has:

- nobody: neither the view nor a connection right;
- reader: read access to the connection ``shop`` only;
- watcher: the view only (Viewer and User under Airflow's default auth managers);
- operator: the view, and read and edit access to ``shop``.

Each refusal must be a 403 whose message names the permission missing; a watcher sees figures but
no message's headers, body or exception message.
"""

from __future__ import annotations

import json
import os
import secrets
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from airflow_provider_sqlqueue.plugins.sqlqueue import NO_QUEUES_VISIBLE
from airflow_provider_sqlqueue.transport import Message, QueueAddress, QueueClient
from demo.services import airflow_connection
from tests.airflow_auth import PerConnectionAuthManager
from tests.test_plugins_sqlqueue import Api

USERS = {"nobody": "nobody", "reader": "reader", "watcher": "watcher", "operator": "operator"}
GRANTS = {"reader": {"shop": ["GET"]}, "operator": {"shop": ["GET", "PUT"]}}
VIEWS = {"watcher": ["JOBS"], "operator": ["JOBS"]}


class ViewGrantingAuthManager(PerConnectionAuthManager):
    """Connection rights from ``SQLQUEUE_TEST_GRANTS``, and Airflow's views from ``SQLQUEUE_TEST_VIEWS``
    (JSON: user -> names of ``AccessView`` members)."""

    def is_authorized_view(self, *, access_view: Any, user: Any) -> bool:
        views = json.loads(os.environ.get("SQLQUEUE_TEST_VIEWS", "{}"))
        return access_view.name in views.get(user.get_name(), [])


@pytest.fixture(scope="module")
def api(airflow_db: str, pg_uri: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    import tests.test_plugins_sqlqueue as plugin_tests

    schema = f"access_{uuid.uuid4().hex[:8]}"
    with QueueClient.connect(pg_uri) as installer:
        installer.session.connection.execute(f'CREATE SCHEMA "{schema}"')
        installer.create_queue(QueueAddress("orders", schema))
    passwords = tmp_path_factory.mktemp("auth") / "passwords.json"
    passwords.write_text(json.dumps(USERS))
    settings = {
        "AIRFLOW__CORE__AUTH_MANAGER": f"{__name__}.ViewGrantingAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{user}:viewer" for user in USERS),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__SQLQUEUE__CONNECTIONS": "shop",
        "AIRFLOW_CONN_SHOP": airflow_connection(pg_uri),
        "AIRFLOW_CONN_PLAIN": airflow_connection(pg_uri).replace("sqlqueue://", "http://", 1),
        "SQLQUEUE_TEST_GRANTS": json.dumps(GRANTS),
        "SQLQUEUE_TEST_VIEWS": json.dumps(VIEWS),
    }
    with pytest.MonkeyPatch.context() as patch:
        for user in list(plugin_tests.USERS):  # Api.token logs in with these users
            patch.delitem(plugin_tests.USERS, user)
        for user, password in USERS.items():
            patch.setitem(plugin_tests.USERS, user, password)
        with plugin_tests.served(settings, schema, pg_uri, patch) as api:
            yield api


def refusal(answer: Any) -> str:
    assert answer.status_code == 403, answer.text
    return str(answer.json()["detail"])


def test_a_user_who_may_see_no_queues_is_told_which_permissions_are_missing(api: Api) -> None:
    assert refusal(api.get("nobody", "/connections")) == NO_QUEUES_VISIBLE
    assert "Browse > Jobs" in NO_QUEUES_VISIBLE and "GET on Connections" in NO_QUEUES_VISIBLE
    assert refusal(api.get("nobody", "/connections/shop/queues")) == (
        "seeing the queues of connection 'shop' needs read access to the connection (GET on Connections) "
        "or Airflow's permission to view Browse > Jobs"
    )
    assert refusal(api.post("nobody", "/connections/shop/purge-expired", {"queue": "orders"})) == (
        "purging expired messages on connection 'shop' needs edit access to the connection (PUT on Connections)"
    )


def test_what_each_user_is_listed(api: Api) -> None:
    def listed(user: str) -> dict[str, tuple[bool, bool]]:
        return {  # other tests' connections may be stored in the shared metadata database: this test's only
            c["connection_id"]: (c["may_read_messages"], c["may_act"])
            for c in api.get(user, "/connections").json()
            if c["connection_id"] == "shop"
        }

    assert listed("reader") == {"shop": (True, False)}  # no view: only what the reader may read
    assert listed("watcher") == {"shop": (False, False)}  # the view: every queue connection, read only
    assert listed("operator") == {"shop": (True, True)}
    [watched] = [c for c in api.get("watcher", "/connections").json() if c["connection_id"] == "shop"]
    assert watched["actions_refusal"] == (
        "retrying, purging, giving claims back and moving due messages on connection 'shop' needs edit access "
        "to the connection (PUT on Connections); you may only watch its queues"
    )
    assert watched["messages_refusal"] == (
        "reading the messages of connection 'shop' (headers, bodies, exception messages) needs read access to the "
        "connection (GET on Connections); you may see its queues' figures only"
    )
    [operated] = [c for c in api.get("operator", "/connections").json() if c["connection_id"] == "shop"]
    assert operated["actions_refusal"] is None and operated["messages_refusal"] is None


def test_a_watcher_sees_figures_but_no_message_and_cannot_act(api: Api) -> None:
    orders = QueueAddress("orders", api.schema)
    queue, error = f'orders@"{api.schema}"', f'error@"{api.schema}"'
    with QueueClient.connect(api.pg_uri) as client:
        client.send(orders, Message("secret body"))
        [failing] = client.claim(orders)
        client.fail(orders, failing, ValueError("secret exception text"))
        client.send(orders, Message("held"))
        [held] = client.claim(orders, lease=timedelta(minutes=5))
        client.nack(orders, held.claim_token, error=ValueError("secret claim error"))
        [_held_again] = client.claim(orders, lease=timedelta(minutes=5))
        try:
            page = api.get("watcher", "/connections/shop/queues", search=api.schema).json()
            figures = {q["address"]: (q["waiting"], q["in_flight"]) for q in page["queues"]}
            assert figures[queue] == (0, 1) and figures[error][0] == 1
            assert api.get("watcher", "/connections/shop/depth", queue=error).json()["count"] == 1

            [claim] = api.get("watcher", "/connections/shop/claims", queue=queue).json()
            assert claim["deliveries"] == 2 and claim["last_error"] is None
            [read_claim] = api.get("reader", "/connections/shop/claims", queue=queue).json()
            assert "secret claim error" in (read_claim["last_error"] or "")

            [group] = api.get("watcher", "/connections/shop/errors", error_queue=error).json()["groups"]
            assert (group["source"], group["exception_type"], group["count"]) == (queue, "builtins.ValueError", 1)
            assert group["newest_message"] is None
            [read_group] = api.get("reader", "/connections/shop/errors", error_queue=error).json()["groups"]
            assert "secret exception text" in read_group["newest_message"]

            assert "you may see its queues' figures only" in refusal(
                api.get("watcher", "/connections/shop/errors/messages", error_queue=error)
            )
            assert "secret body" in api.get("reader", "/connections/shop/errors/messages", error_queue=error).text
            for path, body, action in (
                ("/connections/shop/purge-expired", {"queue": queue}, "purging expired messages"),
                ("/connections/shop/release-lapsed", {"queue": queue}, "giving lapsed claims back"),
                ("/connections/shop/errors/retry", {"error_queue": error, "source": queue}, "retrying failed messages"),
            ):
                for user in ("watcher", "reader"):
                    assert refusal(api.post(user, path, body)) == (
                        f"{action} on connection 'shop' needs edit access to the connection (PUT on Connections); "
                        "you may only watch its queues"
                    )
            assert (client.in_flight(orders), client.depth(QueueAddress("error", api.schema))) == (1, 1)
            retried = api.post("operator", "/connections/shop/errors/retry", {"error_queue": error, "source": queue})
            assert retried.json()["retried"] == 1
        finally:
            client.purge(orders)
            client.purge(QueueAddress("error", api.schema))


def test_watching_covers_the_queue_connections_only(api: Api) -> None:
    # An http connection is no queue connection: the view does not open it (nor tell it from a missing one).
    for conn in ("plain", "no_such_conn"):
        assert f"connection '{conn}' is not one of the queue connections" in refusal(
            api.get("watcher", f"/connections/{conn}/queues")
        )


def test_hostile_connection_ids_are_refused_with_a_message(api: Api) -> None:
    from urllib.parse import quote

    token = {"Authorization": f"Bearer {api.token('watcher')}"}
    for conn in ("\ud800", "shop\x00", "x" * 10_000, "../shop", "shop'; --"):
        path = quote(conn, safe="", errors="surrogatepass")
        for url in (f"/sqlqueue/api/connections/{path}/queues", f"/sqlqueue/api/connections/{path}/errors/messages"):
            answer = api.http.get(url, params={"error_queue": "error"}, headers=token)
            assert 400 <= answer.status_code < 500 and answer.json()["detail"], (conn[:20], answer.status_code)
        answer = api.http.post(
            f"/sqlqueue/api/connections/{path}/purge-expired", json={"queue": "orders"}, headers=token
        )
        assert 400 <= answer.status_code < 500 and answer.json()["detail"], (conn[:20], answer.status_code)


def test_with_teams_hostile_connection_ids_are_refused_with_a_message(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AIRFLOW__CORE__MULTI_TEAM", "True")  # the connection's team is looked up
    token = {"Authorization": f"Bearer {api.token('operator')}"}
    for path in ("shop%00", "%ED%A0%80", "x" * 10_000):
        answer = api.http.get(f"/sqlqueue/api/connections/{path}/queues", headers=token)
        assert answer.status_code in (403, 404) and answer.json()["detail"], answer.text[:200]
    assert api.http.get("/sqlqueue/api/connections/shop/queues", headers=token).status_code == 200
