"""The sqlglot side of `policy.sql`: parse one SQL text and judge every statement node in it.

Imported on the first SQL text to check (sqlglot takes tens of milliseconds to load, and most
commands never see SQL). The rules it applies are described in `policy.sql`.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.simplify import simplify

from corral.policy.sqlverdict import SqlVerdict, SqlVerdictKind

_RANK = {"allow": 0, "require_approval": 1, "deny": 2}

# Statement kinds that only read, or change nothing a protected pattern guards.
_HARMLESS: tuple[type[exp.Expr], ...] = (
    exp.Query, exp.Describe, exp.Show, exp.Use, exp.Set, exp.Transaction, exp.Commit,
    exp.Rollback, exp.Insert, exp.Create, exp.Drop, exp.Delete, exp.Update, exp.Alter,
    exp.TruncateTable, exp.Merge, exp.Copy, exp.Values, exp.Cache, exp.Uncache,
)  # fmt: skip
"""Root statement types the checker understands; any other root type is `sql_unsupported`."""

_UNSUPPORTED: tuple[type[exp.Expr], ...] = tuple(
    t
    for t in (
        getattr(exp, name, None)
        for name in ("Command", "Attach", "Detach", "Pragma", "Install", "Execute", "Call")
    )
    if isinstance(t, type)
)


def judge(
    sql: str,
    dialect: str,
    protected: tuple[str, ...],
    catalog: str | None,
    search_path: tuple[str, ...],
    read_only: bool,
) -> SqlVerdict:
    """Parse ``sql`` as ``dialect`` would and judge its one statement (arguments normalised by
    `policy.sql.check_sql`)."""
    try:
        parsed = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
    except SqlglotError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return SqlVerdict("deny", "sql_unparseable", f"the SQL cannot be parsed: {first}")
    except (RecursionError, ValueError) as err:
        return SqlVerdict("deny", "sql_unparseable", f"the SQL cannot be parsed: {err}")
    if not parsed:
        return SqlVerdict("deny", "sql_empty", "there is no SQL statement to check")
    if len(parsed) > 1:
        return SqlVerdict(
            "deny",
            "sql_multiple_statements",
            f"{len(parsed)} statements in one call; send one statement at a time",
            tuple(_render(s, dialect) for s in parsed),
        )
    ctx = _Names(dialect, protected, catalog, search_path, read_only)
    verdict, reason, message = _judge(parsed[0], ctx)
    return SqlVerdict(verdict, reason, message, (sql.strip().rstrip(";").rstrip(),))


def _render(statement: exp.Expr, dialect: str) -> str:
    try:
        return statement.sql(dialect=dialect)
    except SqlglotError:
        return type(statement).__name__.upper()


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Names:
    dialect: str
    protected: tuple[str, ...]
    catalog: str | None
    search_path: tuple[str, ...]  # `schema` or `catalog.schema`, lower-case
    read_only: bool = False

    def readings(self, parts: Sequence[str]) -> list[str]:
        """Every fully qualified spelling the name may stand for."""
        parts = [p.lower() for p in parts if p]
        out = [".".join(parts)]
        if len(parts) == 1:
            for schema in self.search_path:
                out.append(f"{schema}.{parts[0]}")
                if self.catalog and "." not in schema:
                    out.append(f"{self.catalog}.{schema}.{parts[0]}")
        if len(parts) == 2:
            if self.catalog:
                out.append(f"{self.catalog}.{parts[0]}.{parts[1]}")
            if self.dialect == "duckdb":  # `a.b` may be catalog a, default schema, table b
                out.append(f"{parts[0]}.main.{parts[1]}")
        return out

    def table_protected(self, parts: Sequence[str]) -> str | None:
        """The reading of a table-like name that a protected pattern covers, if any."""
        for name in self.readings(parts):
            if any(fnmatch.fnmatchcase(name, p) for p in self.protected):
                return name
        return None

    def container_protected(self, parts: Sequence[str]) -> str | None:
        """A schema/database/catalog is protected if it is, or may hold, a protected name."""
        readings = [[p.lower() for p in parts if p]]
        if self.catalog and len(readings[0]) == 1:
            readings.append([self.catalog, *readings[0]])
        for name_parts in readings:
            name = ".".join(name_parts)
            for pattern in self.protected:
                if fnmatch.fnmatchcase(name, pattern) or _may_contain(name_parts, pattern):
                    return name
        return None


def _may_contain(container: Sequence[str], pattern: str) -> bool:
    """Could ``pattern`` match a name that starts with ``container.``?"""
    pieces = pattern.split(".")
    if len(pieces) <= len(container):
        return any(ch in pieces[-1] for ch in "*?[") and all(
            fnmatch.fnmatchcase(c, p) for c, p in zip(container, pieces, strict=False)
        )
    return all(fnmatch.fnmatchcase(c, p) for c, p in zip(container, pieces, strict=False))


def _parts(table: exp.Expr) -> list[str]:
    if isinstance(table, exp.Table):
        return [p.name for p in table.parts]
    return [table.name] if table.name else []


# --------------------------------------------------------------------------------------------
# Judging
# --------------------------------------------------------------------------------------------

_Result = tuple[SqlVerdictKind, str, str]
_ALLOW: _Result = ("allow", "sql_allowed", "the statement does not modify a protected name")


def _judge(statement: exp.Expr, ctx: _Names) -> _Result:
    if isinstance(statement, exp.Command):
        return _command(statement)
    if isinstance(statement, _UNSUPPORTED) or not isinstance(statement, _HARMLESS):
        return _unsupported(statement)
    found = _session(statement, ctx)
    if found is not None:
        return found
    if ctx.read_only and not isinstance(statement, _READS):
        return _deny_read_only(statement)
    worst = _ALLOW
    for node in statement.walk():
        result = _judge_node(node, ctx)
        if result is not None and _RANK[result[0]] > _RANK[worst[0]]:
            worst = result
            if worst[0] == "deny":
                break
    return worst


_READS: tuple[type[exp.Expr], ...] = (
    exp.Query,
    exp.Describe,
    exp.Show,
    exp.Values,
    exp.Transaction,
    exp.Commit,
    exp.Rollback,
)
_WRITES: tuple[type[exp.Expr], ...] = (
    exp.Insert,
    exp.Update,
    exp.Delete,
    exp.Merge,
    exp.Create,
    exp.Drop,
    exp.Alter,
    exp.TruncateTable,
    exp.Copy,
    exp.Cache,
    exp.Uncache,
)
_REMOTE_COMMANDS = ("SERVER", "FOREIGN", "USER MAPPING")
_SESSION_SETTINGS = frozenset(
    {
        "search_path",
        "schema",
        "role",
        "session_authorization",
        "default_transaction_read_only",
        "transaction_read_only",
    }
)


def _command(node: exp.Expr) -> _Result:
    """A statement sqlglot keeps as opaque text: session changes and remote servers by name."""
    verb = str(node.this).upper()
    expression = node.args.get("expression")
    rest = (expression.sql() if isinstance(expression, exp.Expr) else str(expression or "")).upper()
    if verb in ("SET", "RESET"):
        return (
            "deny",
            "sql_session_state",
            f"`{verb} {rest[:40]}` changes who runs the statements or how they run; refused",
        )
    if verb in ("CREATE", "IMPORT", "ALTER") and any(w in rest for w in _REMOTE_COMMANDS):
        return (
            "deny",
            "sql_remote_execution",
            f"`{verb} {rest[:40]}` reaches another server; refused",
        )
    return _unsupported(node)


def _session(statement: exp.Expr, ctx: _Names) -> _Result | None:
    """SET / USE / BEGIN … READ WRITE: refused for a read-only role; changing how names resolve
    is refused where names are protected."""
    if isinstance(statement, exp.Transaction):
        modes = " ".join(str(m) for m in statement.args.get("modes") or ()).upper()
        if ctx.read_only and "WRITE" in modes:
            return (
                "deny",
                "sql_session_state",
                "a read-only role cannot start a READ WRITE transaction",
            )
        return None
    if not isinstance(statement, exp.Set | exp.Use):
        return None
    text = statement.sql(dialect=ctx.dialect)[:60]
    if ctx.read_only:
        return (
            "deny",
            "sql_session_state",
            f"a read-only role cannot change its session (`{text}`)",
        )
    names = {n.name.lower() for n in statement.find_all(exp.Identifier)}
    if ctx.protected and (isinstance(statement, exp.Use) or names & _SESSION_SETTINGS):
        return (
            "deny",
            "sql_session_state",
            f"`{text}` would change how protected names resolve; refused",
        )
    return None


def _deny_read_only(node: exp.Expr) -> _Result:
    return ("deny", "sql_read_only", f"`{node.sql()[:60]}` writes, and this role is read-only")


def _unsupported(node: exp.Expr) -> _Result:
    text = node.sql()[:60] if not isinstance(node, exp.Command) else f"{node.this} …"
    return (
        "deny",
        "sql_unsupported",
        f"`{text}` cannot be checked (statements of this kind are not supported)",
    )


def _judge_node(node: exp.Expr, ctx: _Names) -> _Result | None:
    if isinstance(node, _UNSUPPORTED):
        return _unsupported(node)
    if ctx.read_only and isinstance(node, _WRITES):
        return _deny_read_only(node)
    for kind, handler in _HANDLERS:
        if isinstance(node, kind):
            return handler(node, ctx)
    return None


def _truncate(node: exp.Expr, ctx: _Names) -> _Result | None:
    hit = _first(ctx.table_protected(_parts(t)) for t in node.expressions)
    return _deny_destructive("TRUNCATE", hit) if hit else None


def _create(node: exp.Expr, ctx: _Names) -> _Result | None:
    if not node.args.get("replace") or node.this is None:
        return None
    hit = ctx.table_protected(_parts(node.this))
    if hit is None:
        return None
    return (
        "require_approval",
        "sql_replace_protected",
        f"CREATE OR REPLACE over protected `{hit}` needs a human's approval",
    )


def _insert(node: exp.Expr, ctx: _Names) -> _Result | None:
    hit = _target_protected(node.this, ctx) if node.args.get("overwrite") else None
    if hit is None:
        return None
    return (
        "require_approval",
        "sql_replace_protected",
        f"INSERT OVERWRITE into protected `{hit}` needs a human's approval",
    )


def _merge(node: exp.Expr, ctx: _Names) -> _Result | None:
    hit = _target_protected(node.this, ctx)
    if hit is None:
        return None
    return (
        "require_approval",
        "sql_merge_protected",
        f"MERGE into protected `{hit}` needs a human's approval",
    )


def _copy(node: exp.Expr, ctx: _Names) -> _Result | None:
    for item in node.args.get("files") or ():
        if isinstance(item, exp.Identifier | exp.Var | exp.Column) and item.name.upper() in (
            "PROGRAM",
            "STDIN_PROGRAM",
        ):
            return ("deny", "sql_unsupported", "COPY … TO/FROM PROGRAM runs a shell command")
    return None


def _first(items: Iterable[str | None]) -> str | None:
    return next((i for i in items if i), None)


def _deny_destructive(what: str, name: str) -> _Result:
    return ("deny", "sql_destructive_protected", f"{what} on protected `{name}` is refused")


def _target_protected(target: exp.Expr | None, ctx: _Names) -> str | None:
    if target is None:
        return None
    table = target if isinstance(target, exp.Table) else target.find(exp.Table)
    return ctx.table_protected(_parts(table)) if table is not None else None


_CONTAINERS = frozenset({"SCHEMA", "DATABASE", "CATALOG", "NAMESPACE"})


def _drop(node: exp.Expr, ctx: _Names) -> _Result | None:
    if isinstance(node.parent, exp.Alter):
        return None  # ALTER … DROP COLUMN: judged with its ALTER
    kind = str(node.args.get("kind") or "TABLE").upper()
    targets = node.args.get("tables") or ([node.this] if node.this is not None else [])
    for target in targets:
        parts = _parts(target)
        hit = ctx.container_protected(parts) if kind in _CONTAINERS else ctx.table_protected(parts)
        if hit:
            return _deny_destructive(f"DROP {kind}", hit)
    if kind in _CONTAINERS:
        return (
            "deny",
            "sql_destructive",
            f"DROP {kind} removes everything in it; it is refused on any name",
        )
    return None


_ADMIN = frozenset(
    {"pg_terminate_backend", "pg_cancel_backend", "pg_signal_backend", "pg_reload_conf",
     "pg_rotate_logfile", "pg_promote", "pg_switch_wal", "pg_create_restore_point",
     "pg_start_backup", "pg_stop_backup", "pg_backup_start", "pg_backup_stop",
     "pg_wal_replay_pause", "pg_wal_replay_resume", "pg_log_backend_memory_contexts",
     "pg_logical_emit_message", "pg_notify", "set_config", "pg_import_system_collations",
     "pg_truncate_visibility_map", "pg_advisory_lock", "pg_advisory_xact_lock"}
)  # fmt: skip
_ADMIN_PREFIXES = (
    "pg_file_",
    "pg_ls_",
    "pg_read_",
    "pg_stat_reset",
    "pg_replication_",
    "pg_create_",
    "pg_drop_",
    "pg_copy_",
    "lo_",
)
_REMOTE = ("dblink", "query_to_xml", "cursor_to_xml")
_SEQUENCE_WRITES = frozenset({"nextval", "setval"})


def _function(node: exp.Expr, ctx: _Names) -> _Result | None:
    """A call by name: administrative and remote functions are refused; one reached by a
    protected name needs a human's approval (its side effects are unknown)."""
    name = node.name.lower()
    if name in _ADMIN or name.startswith(_ADMIN_PREFIXES):
        return (
            "deny",
            "sql_admin_function",
            f"`{name}()` is an administrative function with side effects; refused",
        )
    if name.startswith(_REMOTE):
        return (
            "deny",
            "sql_remote_execution",
            f"`{name}()` runs SQL given as text (or on another server); refused",
        )
    if ctx.read_only and name in _SEQUENCE_WRITES:
        return ("deny", "sql_read_only", f"`{name}()` writes, and this role is read-only")
    parent = node.parent
    if isinstance(parent, exp.Dot) and parent.expression is node:
        qualifier = [p.strip('"`[]').lower() for p in parent.this.sql().split(".")]
        hit = ctx.table_protected([*qualifier, name])
        if hit:
            return (
                "require_approval",
                "sql_protected_function",
                f"calling `{hit}()` in a protected schema needs a human's approval",
            )
    return None


def _delete_update(node: exp.Expr, ctx: _Names) -> _Result | None:
    hit = _target_protected(node.this, ctx)
    if hit is None and isinstance(node, exp.Delete):
        hit = _first(ctx.table_protected(_parts(t)) for t in node.args.get("tables") or ())
    if hit is None:
        return None
    verb = "DELETE" if isinstance(node, exp.Delete) else "UPDATE"
    where = node.args.get("where")
    if where is None:
        return _deny_destructive(f"{verb} without WHERE", hit)
    if _always_true(where.this):
        return _deny_destructive(f"{verb} with an always-true WHERE", hit)
    code = "sql_delete_protected" if verb == "DELETE" else "sql_update_protected"
    return ("require_approval", code, f"{verb} on protected `{hit}` needs a human's approval")


def _alter(node: exp.Expr, ctx: _Names) -> _Result | None:
    hit = _first(ctx.table_protected(_parts(t)) for t in node.find_all(exp.Table))
    if hit is None:
        return None
    for action in node.args.get("actions") or ():
        if isinstance(action, exp.Drop | exp.DropPartition):
            return _deny_destructive("ALTER … DROP", hit)
    return (
        "require_approval",
        "sql_alter_protected",
        f"ALTER on protected `{hit}` needs a human's approval",
    )


_HANDLERS: tuple[tuple[type[exp.Expr], Callable[[exp.Expr, _Names], _Result | None]], ...] = (
    (exp.Drop, _drop),
    (exp.TruncateTable, _truncate),
    (exp.Delete, _delete_update),
    (exp.Update, _delete_update),
    (exp.Alter, _alter),
    (exp.Create, _create),
    (exp.Insert, _insert),
    (exp.Merge, _merge),
    (exp.Copy, _copy),
    (exp.Anonymous, _function),
)


_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)


def _always_true(predicate: exp.Expr) -> bool:
    """A predicate that selects every row, as far as a static look can tell."""
    if isinstance(predicate, _COMPARISONS) and {type(predicate.left), type(predicate.right)} == {
        exp.Column,
        exp.Literal,
    }:
        return False  # `id = 7`: nothing to simplify (and the most common predicate by far)
    try:
        reduced: exp.Expr = simplify(predicate.copy())
    except (SqlglotError, RecursionError, ValueError, TypeError, AttributeError):
        reduced = predicate
    if isinstance(reduced, exp.Boolean) and not reduced.this:
        return False  # provably selects nothing (`WHERE 1 = 0`)
    return _tautology(predicate) or _tautology(reduced)


def _tautology(e: exp.Expr) -> bool:
    if isinstance(e, exp.Paren):
        return _tautology(e.this)
    if isinstance(e, exp.Boolean):
        return bool(e.this)
    if isinstance(e, exp.Or):
        return _tautology(e.left) or _tautology(e.right)
    if isinstance(e, exp.And):
        return _tautology(e.left) and _tautology(e.right)
    if isinstance(e, exp.EQ | exp.GTE | exp.LTE | exp.NullSafeEQ) and e.left == e.right:
        return True
    if isinstance(e, exp.Like | exp.ILike):
        pattern = e.expression
        if isinstance(pattern, exp.Literal) and pattern.is_string and set(pattern.this) <= {"%"}:
            return bool(pattern.this)
    if e.find(exp.Column) is None:  # names no column: all rows or none; refuse unless provably none
        return not (isinstance(e, exp.Boolean) and not e.this)
    return False
