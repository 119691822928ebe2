"""How ``.ci/test`` shares the suite out among pytest-xdist workers (:mod:`tests.parallel`): the
modules that run Airflow's services with Spark are one unit of work, run in turn by one worker
from the start, while the other workers run every other module, each module on one worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.parallel import STACKS

ROOT = Path(__file__).resolve().parent.parent


def test_the_stacks_run_in_turn_on_one_worker_from_the_start_and_each_other_module_on_one(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: F401\n"
    )
    others = [f"test_other_{n}.py" for n in range(4)]
    for name in (*STACKS, *others):
        (tmp_path / name).write_text(
            "import os, time\n"
            "def log(test):\n"
            f"    with open({str(tmp_path / 'ran')!r}, 'a') as out:\n"
            f"        out.write(f\"{{os.environ['PYTEST_XDIST_WORKER']}} {name} {{test}}\\n\")\n"
            + "".join(
                f"def test_{n}():\n    log({n})\n    time.sleep({1.0 if name in STACKS else 0.1})\n" for n in range(3)
            )
        )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadfile", "--no-loadscope-reorder", "-p",
         "no:cacheprovider", "-q", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    ran = [line.split() for line in (tmp_path / "ran").read_text().splitlines()]
    on = {name: {worker for worker, module, _ in ran if module == name} for name in (*STACKS, *others)}
    assert all(len(workers) == 1 for workers in on.values()), on  # a module's fixtures start once
    [stacks] = {next(iter(on[name])) for name in STACKS}  # one worker runs every stack
    assert [module for worker, module, _ in ran if worker == stacks] == [name for name in STACKS for _ in range(3)]
    assert all(on[name] != {stacks} for name in others)  # the rest runs beside them
