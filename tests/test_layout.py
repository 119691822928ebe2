"""Each source module has its unit tests in one test module named after it.

``airflow_provider_sqlqueue/transport/drivers/postgres.py`` -> ``tests/test_transport_drivers_postgres.py``;
a package's own code (its ``__init__.py``) -> the package's name. The behaviour, contract, chaos
and end-to-end suites (``test_queue_behaviour.py``, ``test_contract*.py``, ``test_chaos.py``,
``test_airflow_services.py``, ...) cut across modules and are named after what they prove.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).parent.parent / "airflow_provider_sqlqueue"
TESTS = Path(__file__).parent


def defines_something(path: Path) -> bool:
    """A module with code of its own, not only imports and re-exports."""
    tree = ast.parse(path.read_text())
    return any(isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) for node in tree.body)


def unit_tests_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "test_" + "_".join(parts) + ".py"


def test_every_source_module_has_its_test_module() -> None:
    modules = [path for path in sorted(PACKAGE.rglob("*.py")) if defines_something(path)]
    assert len(modules) > 25
    missing = [
        f"{path.relative_to(PACKAGE)} -> tests/{unit_tests_of(path)}"
        for path in modules
        if not (TESTS / unit_tests_of(path)).exists()
    ]
    assert not missing, "source modules without their test module:\n" + "\n".join(missing)
