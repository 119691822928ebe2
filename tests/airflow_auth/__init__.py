"""An auth manager for tests: Airflow's simple auth manager (its users, passwords, JWTs and login),
with connection permissions granted per user, connection and method.

The simple auth manager decides connection access by role alone (op and admin: everything), so it
cannot express "may read this connection but not change it" or "may not see that connection";
Airflow's FAB and Keycloak auth managers can. This one grants connection access from
``SQLQUEUE_TEST_GRANTS`` (JSON: user -> connection id -> methods) and is otherwise unchanged, so
the Queues API is tested against each kind of answer an auth manager can give.
"""

from __future__ import annotations

import json
import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager


class PerConnectionAuthManager(SimpleAuthManager):
    def is_authorized_connection(self, *, method: Any, user: Any, details: Any = None) -> bool:
        grants = json.loads(os.environ.get("SQLQUEUE_TEST_GRANTS", "{}"))
        conn_id = details.conn_id if details is not None else None
        return method in grants.get(user.get_name(), {}).get(conn_id, [])
