"""The suite's pytest-xdist scheduler (:mod:`tests.parallel` says why), in a module of its own:
it imports xdist, which a run without workers -- a clean virtualenv's, as tests/test_packaging.py
makes -- may not have; the conftest imports it only when xdist asks for a scheduler."""

from __future__ import annotations

from pathlib import Path

from xdist.scheduler import LoadFileScheduling

from tests.parallel import STACKS


class StacksTogether(LoadFileScheduling):
    """``--dist loadfile`` with every :data:`STACKS` module in one unit of work: the worker that takes
    it runs the stacks one after the other, and the others run the rest beside it. (A lock between
    workers would leave a worker waiting for it with nothing to do.)"""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return "stacks" if Path(module).name in STACKS else module
