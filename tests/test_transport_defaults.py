"""Every default has one home: :mod:`airflow_provider_sqlqueue.transport.defaults`.

A numeric default written into a signature elsewhere is a second home, and the copies drift (a
hook's page size that differs from its client's). Zero is not a tuned figure (no delay, the start
of a queue) and may stand where it is meant.
"""

from __future__ import annotations

import ast
from pathlib import Path

import airflow_provider_sqlqueue

PACKAGE = Path(airflow_provider_sqlqueue.__file__).parent


def numeric_defaults(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        args = node.args
        positional = args.posonlyargs + args.args
        pairs = list(zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True))
        pairs += [
            (arg, default)
            for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True)
            if default is not None
        ]
        for arg, default in pairs:
            value = default.operand if isinstance(default, ast.UnaryOp) else default
            if isinstance(value, ast.Constant) and type(value.value) in (int, float) and value.value != 0:
                found.append(f"{path.name}:{default.lineno} {node.name}({arg.arg}={ast.unparse(default)})")
    return found


def test_no_numeric_default_is_written_outside_the_defaults_module() -> None:
    found = [
        line for path in sorted(PACKAGE.rglob("*.py")) if path.name != "defaults.py" for line in numeric_defaults(path)
    ]
    assert not found, "move these defaults to transport/defaults.py:\n" + "\n".join(found)


def test_the_check_sees_a_numeric_default(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("def f(limit: int = 100, *, delay: float = -1.5, after: int = 0) -> None: ...\n")
    assert [line.split(" ", 1)[1] for line in numeric_defaults(sample)] == ["f(limit=100)", "f(delay=-1.5)"]
