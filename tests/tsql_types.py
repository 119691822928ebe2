"""A type checker for the T-SQL the transport sends: what SQL Server would refuse before running it.

No SQL Server runs where the tests run, and a parser alone accepts ``INSERT ... (Body) VALUES
('{"a":1}')`` although SQL Server refuses it (error 257: no implicit conversion from varchar to
varbinary). This module types every value in a statement -- literals as the driver rendered them,
``?`` parameters as pyodbc binds them, variables as they were declared, columns from the tables'
own DDL -- and checks each place a value meets a type: a column it is inserted into or set to, a
variable it initialises, a value it is compared with, a TOP count, a VALUES column shared by
several rows.

The conversion rules are SQL Server's (its data type conversion chart and precedence list), for
the types the transport uses. A pair the table does not list is reported, not assumed: this
checker only passes what it knows SQL Server accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

#: SQL Server's data type precedence, highest first: the type a mix of values converts to.
PRECEDENCE = ["datetime2", "datetime", "bigint", "int", "bit", "uniqueidentifier", "nvarchar", "varchar", "varbinary"]
TEXT = {"varchar", "nvarchar"}
NUMBERS = {"bigint", "int", "bit"}

#: (from, to) pairs SQL Server converts implicitly, beyond a type to itself.
IMPLICIT = (
    {(a, b) for a in NUMBERS for b in NUMBERS}
    | {(a, b) for a in TEXT for b in TEXT}
    | {(a, b) for a in NUMBERS for b in TEXT}
    | {(a, b) for a in TEXT for b in NUMBERS}
    | {(a, "uniqueidentifier") for a in TEXT}
    | {("uniqueidentifier", b) for b in TEXT}
    | {(a, b) for a in TEXT for b in ("datetime", "datetime2")}
    | {("datetime", "datetime2"), ("datetime2", "datetime")}
    | {("varbinary", b) for b in TEXT | NUMBERS | {"uniqueidentifier"}}
    | {(a, "varbinary") for a in NUMBERS | {"uniqueidentifier"}}
    | {(a, "datetime") for a in NUMBERS}
)
#: Pairs SQL Server refuses implicitly, with its error number (so a report says why).
REFUSED = {
    **{(a, "varbinary"): 257 for a in TEXT},
    **{(a, "uniqueidentifier"): 206 for a in NUMBERS | {"datetime", "datetime2"}},
    **{("uniqueidentifier", b): 206 for b in NUMBERS | {"datetime", "datetime2"}},
    **{(a, "datetime2"): 206 for a in NUMBERS},
}


@dataclass(frozen=True)
class Typed:
    """A value's SQL Server type; ``null`` for a NULL literal, which converts to anything."""

    name: str
    #: A literal (text as written), for the rule that text never becomes a body, even explicitly.
    literal: bool = False
    null: bool = False


UNKNOWN = Typed("unknown")


def base_type(data_type: exp.DataType) -> str:
    name = data_type.sql("tsql").lower().split("(")[0]
    return {
        "integer": "int",
        "char": "varchar",
        "nchar": "nvarchar",
        "binary": "varbinary",
        "text": "varchar",
        "ntext": "nvarchar",
    }.get(name, name)


def table_columns(create_table_sql: str) -> dict[str, str]:
    """Column name (lower case) -> base type, from a CREATE TABLE statement (possibly inside IF ... BEGIN)."""
    create = sqlglot.parse_one(create_table_sql, read="tsql").find(exp.Create)
    assert create is not None, create_table_sql
    return {c.name.lower(): base_type(c.args["kind"]) for c in create.find_all(exp.ColumnDef)}


@dataclass
class Checker:
    """Checks one batch. ``tables``: table name (lower case) -> columns; ``parameters``: ``@__pN`` -> type."""

    tables: Mapping[str, Mapping[str, str]]
    parameters: Mapping[str, Typed] = field(default_factory=dict)
    variables: dict[str, Typed] = field(default_factory=dict)
    table_variables: dict[str, dict[str, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    # -- typing ------------------------------------------------------------------------------

    def type_of(self, node: exp.Expression | None, scope: Mapping[str, Mapping[str, str]]) -> Typed:  # noqa: C901  # one branch per T-SQL expression form
        if node is None:
            return UNKNOWN
        if isinstance(node, exp.Paren):
            return self.type_of(node.this, scope)
        if isinstance(node, exp.Null):
            return Typed("null", literal=True, null=True)
        if isinstance(node, exp.HexString):
            return Typed("varbinary", literal=True)
        if isinstance(node, exp.Column) and node.name.lower() == "0x" and not node.table:
            return Typed("varbinary", literal=True)  # sqlglot reads the empty binary literal 0x as a name
        if isinstance(node, exp.National):
            return Typed("nvarchar", literal=True)
        if isinstance(node, exp.Literal):
            if node.is_string:
                return Typed("varchar", literal=True)
            text = node.this
            if "." in text or "e" in text.lower():
                return Typed("float", literal=True)
            return Typed("int" if -(2**31) <= int(text) < 2**31 else "bigint", literal=True)
        if isinstance(node, exp.Neg):
            return self.type_of(node.this, scope)
        if isinstance(node, exp.Parameter):
            name = node.sql("tsql").lower()
            if name in self.parameters:
                return self.parameters[name]
            if name in self.variables:
                return self.variables[name]
            if name.startswith("@@"):
                return Typed("int")
            self.problems.append(f"{name} is used but never declared")
            return UNKNOWN
        if isinstance(node, (exp.Cast, exp.Convert, exp.TryCast)):
            target = node.args.get("to")
            to = base_type(target) if isinstance(target, exp.DataType) else UNKNOWN.name
            source = self.type_of(node.this if not isinstance(node, exp.Convert) else node.expression, scope)
            if to == "varbinary" and source.name in TEXT and not source.null:
                self.problems.append(f"{node.sql('tsql')[:80]}: text converted to a body changes its bytes")
            return Typed(to)
        if isinstance(node, exp.Column):
            return self.column_type(node, scope)
        if isinstance(node, exp.Uuid):
            return Typed("uniqueidentifier")
        if isinstance(node, exp.DateAdd):
            self.expect_number(node.expression, scope, f"DATEADD amount in {node.sql('tsql')[:60]}")
            return self.type_of(node.this, scope)
        if isinstance(node, exp.Anonymous):
            return {
                "GETUTCDATE": Typed("datetime"),
                "SYSUTCDATETIME": Typed("datetime2"),
                "DB_NAME": Typed("nvarchar"),
                "QUOTENAME": Typed("nvarchar"),
                "XACT_STATE": Typed("int"),
            }.get(node.name.upper(), UNKNOWN)
        if isinstance(node, exp.Coalesce):
            values = [node.this, *node.expressions]
            return self.common_type([self.type_of(v, scope) for v in values], node.sql("tsql")[:60])
        if isinstance(node, (exp.Max, exp.Min)):
            return self.type_of(node.this, scope)
        if isinstance(node, exp.Count):
            return Typed("bigint")
        if isinstance(node, exp.Case):
            values = [when.args.get("true") for when in node.args.get("ifs", [])] + [node.args.get("default")]
            return self.common_type([self.type_of(v, scope) for v in values if v is not None], node.sql("tsql")[:60])
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)):
            left, right = self.type_of(node.this, scope), self.type_of(node.expression, scope)
            if isinstance(node, exp.Add) and left.name in TEXT and right.name in TEXT:
                return Typed("nvarchar" if "nvarchar" in (left.name, right.name) else "varchar")
            for side in (left, right):
                if side.name not in NUMBERS and not side.null and side is not UNKNOWN:
                    self.problems.append(f"arithmetic on {side.name} in {node.sql('tsql')[:60]}")
            return self.common_type([left, right], node.sql("tsql")[:60])
        if isinstance(node, exp.Subquery):
            select = node.this
            if isinstance(select, exp.Select) and len(select.expressions) == 1:
                return self.type_of(select.expressions[0], self.scope_of(select))
        return UNKNOWN

    def column_type(self, column: exp.Column, scope: Mapping[str, Mapping[str, str]]) -> Typed:
        name = column.name.lower()
        if column.table and column.table.lower() not in scope:
            return UNKNOWN  # catalog views (sys.columns AS col) are not typed here
        candidates = [scope[column.table.lower()]] if column.table else list(scope.values())
        for columns in candidates:
            if name in columns:
                return Typed(columns[name])
        return UNKNOWN  # catalog views, OPENJSON, CTE columns: not typed here

    def common_type(self, types: list[Typed], where: str) -> Typed:
        """The type SQL Server gives a mix of values (VALUES rows, COALESCE): highest precedence wins."""
        known = [t for t in types if not t.null and t is not UNKNOWN]
        if not known:
            return types[0] if types else UNKNOWN
        ranked = [t for t in known if t.name in PRECEDENCE]
        if len(ranked) != len(known):
            return UNKNOWN
        result = min(ranked, key=lambda t: PRECEDENCE.index(t.name))
        for each in known:
            self.convert(each, result.name, where)
        return Typed(result.name)

    # -- checks ------------------------------------------------------------------------------

    def convert(self, source: Typed, target: str, where: str) -> None:
        """Report a value SQL Server would not convert implicitly to ``target``."""
        if (source.null and source.literal) or source is UNKNOWN or source.name == target:
            return
        pair = (source.name, target)
        if pair in REFUSED:
            self.problems.append(f"{where}: {source.name} -> {target} is refused (error {REFUSED[pair]})")
        elif pair not in IMPLICIT:
            self.problems.append(f"{where}: {source.name} -> {target} is not a conversion this checker knows")

    def expect_number(self, node: exp.Expression | None, scope: Mapping[str, Mapping[str, str]], where: str) -> None:
        typed = self.type_of(node, scope)
        if typed is not UNKNOWN and typed.name not in {"int", "bigint"} and not typed.null:
            self.problems.append(f"{where}: needs an integer, got {typed.name}")

    def scope_of(self, node: exp.Expression) -> dict[str, Mapping[str, str]]:
        """Alias (or name) -> columns of the tables, table variables and VALUES a statement reads."""
        scope: dict[str, Mapping[str, str]] = {}
        for table in node.find_all(exp.Table):
            name = table.name.lower()
            columns = self.table_variables.get(name) if name.startswith("@") else self.tables.get(name)
            if columns is None and table.this is not None and isinstance(table.this, exp.Parameter):
                columns = self.table_variables.get(table.this.sql("tsql").lower())
            if columns is not None:
                scope[(table.alias or name).lower()] = columns
                scope.setdefault(name, columns)
        for values in node.find_all(exp.Values):
            alias = values.args.get("alias")
            if alias is not None and alias.columns:
                names = [c.name.lower() for c in alias.columns]
                rows = [row.expressions for row in values.expressions]
                columns = {}
                for i, column in enumerate(names):
                    typed = self.common_type([self.type_of(row[i], {}) for row in rows], f"VALUES column {column}")
                    columns[column] = typed.name
                scope[alias.name.lower()] = columns
        # DELETE ... OUTPUT deleted.X and UPDATE ... OUTPUT inserted.X read the target's columns.
        target = node.this if isinstance(node, (exp.Delete, exp.Update)) else None
        if isinstance(target, exp.Table):
            for cte in node.find_all(exp.CTE):
                if cte.alias.lower() == target.name.lower():
                    inner = self.scope_of(cte.this)
                    if inner:
                        columns = next(iter(inner.values()))
                        scope.update({"deleted": columns, "inserted": columns, target.name.lower(): columns})
        return scope

    def check(self, statements: list[exp.Expression]) -> list[str]:
        for statement in statements:
            self.check_statement(statement)
        return self.problems

    def check_statement(self, statement: exp.Expression) -> None:
        if isinstance(statement, exp.Declare):
            for item in statement.expressions:
                name = (
                    item.this[0].sql("tsql").lower() if isinstance(item.this, list) else item.this.sql("tsql").lower()
                )
                kind = item.args.get("kind")
                if isinstance(kind, exp.Schema) or item.args.get("table") is not None:
                    source = kind if isinstance(kind, exp.Schema) else item.args.get("table")
                    self.table_variables[name] = {
                        c.name.lower(): base_type(c.args["kind"]) for c in source.find_all(exp.ColumnDef)
                    }
                    continue
                declared = base_type(kind) if isinstance(kind, exp.DataType) else UNKNOWN.name
                default = item.args.get("default")
                if default is not None:
                    self.convert(self.type_of(default, self.scope_of(default)), declared, f"DECLARE {name}")
                self.variables[name] = Typed(declared)
            return
        scope = self.scope_of(statement)
        for limit in statement.find_all(exp.Limit):
            self.expect_number(limit.expression, scope, "TOP")
        for insert in statement.find_all(exp.Insert):
            self.check_insert(insert)
        for update in statement.find_all(exp.Update):
            update_scope = self.scope_of(update)
            for assignment in update.expressions:
                if isinstance(assignment, exp.EQ) and isinstance(assignment.this, exp.Column):
                    target = self.column_type(assignment.this, update_scope)
                    if target is not UNKNOWN:
                        value = self.type_of(assignment.expression, update_scope)
                        self.convert(value, target.name, f"SET {assignment.this.name}")
        for comparison in statement.find_all(exp.EQ):
            if comparison.find_ancestor(exp.Update) is not None and isinstance(comparison.parent, exp.Update):
                continue
            left, right = self.type_of(comparison.this, scope), self.type_of(comparison.expression, scope)
            if UNKNOWN in (left, right) or left.null or right.null:
                continue
            if (
                (left.name, right.name) not in IMPLICIT
                and (right.name, left.name) not in IMPLICIT
                and left.name != right.name
            ):
                self.problems.append(f"{comparison.sql('tsql')[:60]}: cannot compare {left.name} with {right.name}")

    def check_insert(self, insert: exp.Insert) -> None:
        schema = insert.this
        if not isinstance(schema, exp.Schema):
            return
        table = schema.this
        name = table.sql("tsql").lower() if isinstance(table, exp.Parameter) else table.name.lower()
        columns = self.table_variables.get(name) if name.startswith("@") else self.tables.get(name)
        if columns is None:
            self.problems.append(f"INSERT into unknown table {name}")
            return
        targets = [c.name.lower() for c in schema.expressions]
        for target in targets:
            if target not in columns:
                self.problems.append(f"INSERT into {name}: no column {target} (error 207)")
        source = insert.expression
        rows: list[tuple[list[exp.Expression], Mapping[str, Mapping[str, str]]]] = []
        if isinstance(source, exp.Values):
            rows = [(row.expressions, {}) for row in source.expressions]
        elif isinstance(source, exp.Select):
            rows = [(source.expressions, self.scope_of(source))]
        for values, scope in rows:
            if len(values) != len(targets):
                self.problems.append(f"INSERT into {name}: {len(values)} values for {len(targets)} columns")
                continue
            for target, value in zip(targets, values, strict=True):
                if target in columns:
                    self.convert(self.type_of(value, scope), columns[target], f"INSERT {name}.{target}")
