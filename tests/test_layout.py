"""Each source module has its unit tests in one test module named after it.

``airflow_provider_sqlqueue/transport/drivers/postgres.py`` -> ``tests/test_transport_drivers_postgres.py``;
a package's own code (its ``__init__.py``) -> the package's name. The behaviour, contract, chaos
and end-to-end suites (``test_queue_behaviour.py``, ``test_contract*.py``, ``test_chaos.py``,
``test_airflow_services.py``, ...) cut across modules and are named after what they prove.
"""

from __future__ import annotations

import ast
import re
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


#: Lines a module may have: one capability a maintainer can read whole. The client facade (every
#: call of the API, each a few lines over an operation), the dialects' SQL text and the dialect
#: interface that declares each statement (a docstring per statement) may be longer.
MAX_LINES = 800
LONGER = {
    "transport/client.py": 1600,
    "transport/dialects/base.py": 1000,
    "transport/dialects/postgres.py": 1600,
    "transport/dialects/sqlserver.py": 1600,
}


def test_no_module_outgrows_what_a_maintainer_can_read_whole() -> None:
    lengths = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
    assert set(LONGER) <= set(lengths)
    too_long = {name: n for name, n in lengths.items() if n > LONGER.get(name, MAX_LINES)}
    assert not too_long, f"split by capability (see docs/architecture.md): {too_long}"


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def test_the_architecture_map_names_every_module_and_only_files_that_exist() -> None:
    """docs/architecture.md is the map a maintainer reads first: it must stay true as modules come
    and go, so every module with code is named there, and every path it names exists."""
    text = ARCHITECTURE.read_text()
    named = set(re.findall(r"`((?:[\w.]+/)*\w+\.py)`", text))
    modules = {str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py") if path.read_text().strip()}
    assert len(modules) > 40
    missing = sorted(modules - named)
    assert not missing, "modules docs/architecture.md does not name:\n" + "\n".join(missing)
    stale = sorted(path for path in named if not (PACKAGE / path).exists() and not (PACKAGE.parent / path).exists())
    assert not stale, "paths docs/architecture.md names that do not exist:\n" + "\n".join(stale)


def module_name(path: Path, root: Path = PACKAGE) -> str:
    """``transport/pump.py`` -> ``airflow_provider_sqlqueue.transport.pump``; a package's ``__init__.py`` -> the package."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str], root: Path = PACKAGE) -> set[str]:
    """The package's own modules that ``path`` imports, at any nesting level (in functions, under
    ``if TYPE_CHECKING:``): ``import a.b`` and ``from a.b import name`` import ``a.b`` (a package: its
    ``__init__``), unless ``a.b.name`` is a module of its own -- then ``from a.b import name``, and
    ``from . import name`` in a package's module, import that module and not the package's
    ``__init__``. Relative imports are resolved from the importing module's package.

    A module's imports from its own package count like any other (``from . import Dialect`` in a
    module whose package's ``__init__`` imports that module back is a circle): what a package's
    ``__init__`` re-exports is defined in a module of its own, which the others import."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # ``import a.b.name``'s module, or none of the package's
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Each module of the package ``root`` -> the package's modules it imports."""
    paths = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    modules = set(paths)
    return {name: imports_of(path, modules, root) for name, path in paths.items()}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each group of modules that import each other (a strongly connected
    component of the graph, found with Tarjan's algorithm), as the modules in import order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph[module]):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == module:
                    break
            if len(group) > 1 or module in graph[module]:
                groups.append(group)

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return [circle_in(graph, group) for group in groups]


def circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest way from the group's first module back to itself, through the group's modules."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for module in frontier:
            for imported in sorted(graph[module] & group):
                if imported == start:
                    return [*paths[module], start]
                if imported not in paths:
                    paths[imported] = [*paths[module], imported]
                    following.append(imported)
        frontier = following
    raise AssertionError(f"no circle in {sorted(group)}")  # not reached: the group is strongly connected


def test_the_package_has_no_import_circles() -> None:
    """Imports point one way: no module imports, even lazily in a function, one that imports it back."""
    circles = import_circles(import_graph())
    for circle in circles:
        print("import circle: " + " -> ".join(circle))
    assert not circles, "modules that import each other:\n" + "\n".join(" -> ".join(c) for c in circles)


def test_the_circle_finder_counts_every_kind_of_import(tmp_path: Path) -> None:
    """On a package made for it: lazy and TYPE_CHECKING imports, relative ones of every level, a
    module named by ``from . import``, a package counting as its ``__init__`` (its own modules'
    imports of it too)."""
    root = tmp_path / "shop"
    files = {
        "__init__.py": "",
        "cli.py": "from .console import STATUS\n",
        "console.py": "STATUS = 1\ndef main():\n    from . import cli\n",
        "orders/__init__.py": "def get(name):\n    from .store import Store\n",
        "orders/store.py": "from . import get, rows as r\nfrom .. import cli\n",
        "orders/rows.py": "import typing\nif typing.TYPE_CHECKING:\n    from shop.orders.deep import inner\n",
        "orders/deep/__init__.py": "",
        "orders/deep/inner.py": "from ... import orders\nimport shop.console\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    graph = import_graph(root)
    assert graph == {
        "shop": set(),
        "shop.cli": {"shop.console"},
        "shop.console": {"shop.cli"},
        "shop.orders": {"shop.orders.store"},
        "shop.orders.store": {"shop.orders", "shop.orders.rows", "shop.cli"},
        "shop.orders.rows": {"shop.orders.deep.inner"},
        "shop.orders.deep": set(),
        "shop.orders.deep.inner": {"shop.orders", "shop.console"},
    }
    assert import_circles(graph) == [
        ["shop.cli", "shop.console", "shop.cli"],
        ["shop.orders", "shop.orders.store", "shop.orders"],  # a package's __init__ and its module
    ]
    graph["shop.orders.store"] -= {"shop.orders"}
    graph["shop.orders.deep.inner"] -= {"shop.orders"}
    graph["shop.console"] = {"shop.orders"}  # the way round through a package's __init__ instead
    assert import_circles(graph) == [["shop.cli", "shop.console", "shop.orders", "shop.orders.store", "shop.cli"]]
