"""Sphinx directives that read the reference from the code itself, at build time.

- ``sqlqueue-cli-help``: the ``--help`` text of ``sqlqueue`` and of each of its commands.
- ``sqlqueue-http-routes``: the Queues API's routes, from the FastAPI application the plugin mounts.
"""

from __future__ import annotations

import argparse
import inspect
import os
from typing import Any

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

logger = logging.getLogger(__name__)

#: A fixed width, so the help text does not depend on the terminal that builds the docs.
HELP_COLUMNS = "100"


def _help(parser: argparse.ArgumentParser) -> str:
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_COLUMNS
    try:
        return parser.format_help()
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous


class CliHelp(SphinxDirective):
    """The help of ``sqlqueue`` and of every command, each under a heading of its own."""

    def run(self) -> list[nodes.Node]:
        from airflow_provider_sqlqueue.cli import build_parser

        parser = build_parser()
        out: list[nodes.Node] = [nodes.literal_block(text=_help(parser), language="text")]
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # noqa: SLF001  # argparse keeps its subcommands here
        for name, sub in commands.choices.items():
            section = nodes.section(ids=[f"sqlqueue-{name}"], names=[f"sqlqueue {name}"])
            section += nodes.title(text=f"sqlqueue {name}")
            section += nodes.literal_block(text=_help(sub), language="text")
            out.append(section)
        return out


#: What each of the API's permission checks asks for, by the name of the dependency that checks it.
PERMISSIONS = {
    "see_figures": "read access to the connection, or Airflow's permission to view Browse > Jobs",
    "read_messages": "read access to the connection",
    "edit_connection": "edit access to the connection",
}


def _checks(dependant: Any) -> list[str]:
    found = []
    for dependency in dependant.dependencies:
        name = getattr(dependency.call, "__name__", "")
        if name in PERMISSIONS:
            found.append(PERMISSIONS[name])
        found += _checks(dependency)
    return found


class HttpRoutes(SphinxDirective):
    """A table of the Queues API's routes: method, path, permission and what the route says of itself."""

    def run(self) -> list[nodes.Node]:
        from airflow_provider_sqlqueue.plugins.sqlqueue import URL_PREFIX, create_app

        rows: list[tuple[str, str, str, str]] = []
        for route in create_app().routes:
            if not getattr(route, "include_in_schema", False):
                continue
            methods = ", ".join(sorted(getattr(route, "methods", ()) or ()))
            checks = sorted(set(_checks(route.dependant)))
            if route.path == "/api/connections":
                needs = "lists the connections whose queues the caller may see"
            elif len(checks) == 1:
                needs = checks[0]
            else:
                logger.warning("the Queues API route %s %s: no known permission check found", methods, route.path)
                needs = "?"
            doc = " ".join((inspect.getdoc(route.endpoint) or "").replace("``", "").split())
            query = [param.name for param in route.dependant.query_params]
            body = [
                name
                for param in route.dependant.body_params
                for name in getattr(param.field_info.annotation, "model_fields", {})
            ]
            if query:
                doc += f" Query: {', '.join(query)}."
            if body:
                doc += f" JSON body: {', '.join(body)}."
            rows.append((methods, URL_PREFIX + route.path, needs, doc.strip()))
        return [self._table(rows)]

    @staticmethod
    def _table(rows: list[tuple[str, str, str, str]]) -> nodes.table:
        table = nodes.table()
        group = nodes.tgroup(cols=4)
        table += group
        for width in (8, 40, 20, 60):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        group += head
        body = nodes.tbody()
        group += body

        def row(cells: tuple[str, ...], literal: tuple[bool, ...]) -> nodes.row:
            r = nodes.row()
            for text, is_literal in zip(cells, literal, strict=True):
                entry = nodes.entry()
                entry += nodes.paragraph("", "", nodes.literal(text=text) if is_literal else nodes.Text(text))
                r += entry
            return r

        head += row(("method", "path", "permission", "what it does"), (False, False, False, False))
        for cells in rows:
            body += row(cells, (False, True, False, False))
        return table


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("sqlqueue-cli-help", CliHelp)
    app.add_directive("sqlqueue-http-routes", HttpRoutes)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
