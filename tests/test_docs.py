"""The documentation site: every Python block of the docs runs, and the site builds without a warning.

Each page's Python blocks run in order in one namespace, as a reader would paste them, against the
real PostgreSQL of ``pg_uri``: ``SQLQUEUE_CONN`` names it and ``SQLQUEUE_SCHEMA`` a schema made for
that page alone, so pages never see each other's queues. A block that cannot run here is marked by
the HTML comment ``<!-- docs-test: skip: <reason> -->`` on the line before it, and the reason is
required. A block marked ``<!-- docs-test: dag <dag_id> -->`` is a DAG file: it is parsed, and the
DAG it defines must have that id.

The site is built with ``sphinx-build -W --keep-going`` (every warning an error) into a temporary
directory.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted([ROOT / "README.md", *DOCS.rglob("*.md")], key=str)
PAGES = [p for p in PAGES if "_build" not in p.parts]

FENCE = re.compile(r"^```(?P<lang>[\w{}-]*)[^\n]*\n(?P<code>.*?)^```\s*$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!--\s*docs-test:\s*(?P<kind>skip|dag)\b:?\s*(?P<arg>.*?)\s*-->\s*$")
#: Blocks that cannot run standalone stay few: each one is a part of the docs nobody checks.
MOST_SKIPPED = 6


@dataclass
class Block:
    page: Path
    line: int
    code: str
    skip: str | None = None
    dag: str | None = None

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    blocks = []
    for match in FENCE.finditer(text):
        if match["lang"] != "python":
            continue
        line = text.count("\n", 0, match.start()) + 1
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        block = Block(page, line, match["code"])
        marker = MARKER.search(before)
        if marker and marker["kind"] == "skip":
            block.skip = marker["arg"]
            assert block.skip, f"{block.where()}: a skipped block says why"
        elif marker:
            block.dag = marker["arg"]
        blocks.append(block)
    return blocks


ALL = {page: python_blocks(page) for page in PAGES}
RUNNABLE = [page for page, blocks in ALL.items() if any(not b.skip for b in blocks)]


def test_few_blocks_are_skipped_and_each_says_why() -> None:
    skipped = [b for blocks in ALL.values() for b in blocks if b.skip]
    assert len(skipped) <= MOST_SKIPPED, [b.where() for b in skipped]
    assert all(len(b.skip or "") >= 10 for b in skipped), [(b.where(), b.skip) for b in skipped]
    assert sum(len(blocks) for blocks in ALL.values()) > 3 * len(skipped)


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_of_the_page_runs(
    page: Path, pg_uri: str, schema: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SQLQUEUE_CONN", pg_uri)
    monkeypatch.setenv("SQLQUEUE_SCHEMA", schema)
    namespace: dict[str, object] = {"__name__": f"docs_{page.stem.replace('-', '_')}"}
    ran = []
    for block in ALL[page]:
        if block.skip:
            continue
        if block.dag:
            parse_dag_file(block, tmp_path)
        else:
            try:
                exec(compile(block.code, block.where(), "exec"), namespace)  # noqa: S102  # the docs' own examples
            except Exception as exc:
                raise AssertionError(f"{block.where()}: the example raised {exc!r}") from exc
        ran.append(block.where())
    assert ran == [b.where() for b in ALL[page] if not b.skip]


#: Pages whose every block runs on its own, as a reader who starts at any block pastes it.
STANDALONE = [DOCS / "quickstart.md"]


@pytest.mark.parametrize("page", STANDALONE, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_block_of_a_standalone_page_runs_on_its_own(
    page: Path, pg_uri: str, schema: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SQLQUEUE_CONN", pg_uri)
    monkeypatch.setenv("SQLQUEUE_SCHEMA", schema)
    blocks = [b for b in ALL[page] if not b.skip and not b.dag]
    assert len(blocks) > 1
    for block in blocks:
        try:
            exec(compile(block.code, block.where(), "exec"), {"__name__": "docs_standalone"})  # noqa: S102
        except Exception as exc:
            raise AssertionError(f"{block.where()}: the example raised {exc!r} when run on its own") from exc


def parse_dag_file(block: Block, tmp_path: Path) -> None:
    """A DAG file of the docs, parsed as Airflow's dag-processor parses a DAGs folder: it defines that one DAG."""
    from airflow.dag_processing.dagbag import DagBag

    folder = tmp_path / f"dags_{block.line}"
    folder.mkdir()
    (folder / f"{block.dag}.py").write_text(block.code, encoding="utf-8")
    bag = DagBag(dag_folder=str(folder))
    assert not bag.import_errors, f"{block.where()}: {bag.import_errors}"
    assert list(bag.dags) == [block.dag], f"{block.where()}: defines {list(bag.dags)}"
    assert bag.dags[block.dag].tasks, f"{block.where()}: a DAG without tasks"


def test_the_reference_documents_every_operator_sensor_and_trigger() -> None:
    import inspect

    from airflow.models import BaseOperator
    from airflow.triggers.base import BaseTrigger

    from airflow_provider_sqlqueue.operators import sqlqueue as operators
    from airflow_provider_sqlqueue.sensors import sqlqueue as sensors
    from airflow_provider_sqlqueue.triggers import sqlqueue as triggers

    api = (DOCS / "reference" / "api.rst").read_text(encoding="utf-8")
    for module, base in ((operators, BaseOperator), (sensors, BaseOperator), (triggers, BaseTrigger)):
        public = [
            name
            for name, value in vars(module).items()
            if inspect.isclass(value)
            and issubclass(value, base)
            and value.__module__ == module.__name__
            and not name.startswith("_")
        ]
        assert public
        for name in public:
            assert f"autoclass:: {module.__name__}.{name}" in api, f"{name} is missing from docs/reference/api.rst"


def test_the_reference_documents_the_public_api_and_no_internals() -> None:
    """Every name the transport exports, the hook's errors and the Spark functions a user calls; not
    the Spark package's layout (its module docstring, written for whoever changes it)."""
    from airflow_provider_sqlqueue import transport
    from airflow_provider_sqlqueue.transport import errors

    api = (DOCS / "reference" / "api.rst").read_text(encoding="utf-8")
    for name in transport.__all__:
        if not hasattr(errors, name):  # the errors module is documented whole
            assert f"autoclass:: airflow_provider_sqlqueue.transport.{name}" in api, f"{name} is missing"
    for name in ("ConnectionNotDefinedError", "UnsupportedConnectionError"):
        assert f"autoexception:: airflow_provider_sqlqueue.hooks.sqlqueue.{name}" in api, f"{name} is missing"
    spark = set(re.findall(r"auto\w+:: airflow_provider_sqlqueue\.spark\.(\w+)", api))
    assert spark == {
        "register", "save_to_queue", "batch_writer", "claimed_from_queue", "relay_batch", "Relayed", "ack_held",
        "nack_held", "forget_write", "send_rows", "read_queue", "InvalidOptionError",
    }  # fmt: skip
    assert "automodule:: airflow_provider_sqlqueue.spark" not in api


def test_signatures_show_their_types() -> None:
    config: dict[str, object] = {"__file__": str(DOCS / "conf.py")}
    exec(compile((DOCS / "conf.py").read_text(encoding="utf-8"), "conf.py", "exec"), config)  # noqa: S102
    assert config["autodoc_typehints"] in ("signature", "both")


def test_one_airflow_floor_is_stated_everywhere() -> None:
    """The floor pyproject declares, and no other Airflow version, wherever the docs name one."""
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    [floor] = [re.search(r">=([\d.]+)", d)[1] for d in declared if d.startswith("apache-airflow>")]  # type: ignore[index]
    stated = {
        (page.relative_to(ROOT).as_posix(), version)
        for page in PAGES
        if page.name != "changelog.md"
        for version in re.findall(r"Airflow (3\.\d+(?:\.\d+)?)|Apache Airflow \| (3\.[\d.]+)", page.read_text())
        for version in version
        if version
    }
    assert stated and {version for _, version in stated} == {floor}, sorted(stated)


def test_the_python_versions_stated_are_the_classifiers() -> None:
    """install.md's "Python 3.11 to 3.13" and pyproject's classifiers name the same versions."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    classified = [int(c.rsplit(".", 1)[1]) for c in project["classifiers"] if re.fullmatch(r".*Python :: 3\.\d+", c)]
    low, high = re.search(r"Python 3\.(\d+) to 3\.(\d+)", (DOCS / "install.md").read_text(encoding="utf-8")).groups()  # type: ignore[union-attr]
    assert classified == list(range(int(low), int(high) + 1))
    assert project["requires-python"] == f">=3.{low}"


def test_the_site_builds_without_a_warning(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", str(DOCS), str(tmp_path / "html")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    built = {p.relative_to(tmp_path / "html").as_posix() for p in (tmp_path / "html").rglob("*.html")}
    for page in ("index", "quickstart", "guides/transport", "reference/api", "reference/cli", "reference/http"):
        assert f"{page}.html" in built
