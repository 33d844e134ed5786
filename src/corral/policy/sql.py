"""Is this SQL safe to run on the lakehouse? Parsed with sqlglot (dialect-aware), never grepped.

`check_sql` parses the text the way the named dialect would and looks at every statement node in
the tree — including data-modifying statements hidden in CTEs and subqueries
(``WITH x AS (DELETE … RETURNING *) SELECT …``). Comments are dropped by the parser, so SQL
hidden in a comment is not run and not judged; MySQL-style executable comments (``/*! … */``)
are refused.

Verdicts (``reason`` is a machine code):

- unparseable input → deny ``sql_unparseable``; empty input → deny ``sql_empty``;
  more than one statement → deny ``sql_multiple_statements``;
- statements the checker cannot account for — ``EXECUTE``, ``CALL``, ``DO``, ``EXPLAIN``,
  ``LOAD``/``INSTALL``, ``ATTACH``/``DETACH``, ``PRAGMA``, ``COPY … TO/FROM PROGRAM``, anything
  sqlglot only keeps as an opaque command — deny ``sql_unsupported``;
- on a *protected* name (fnmatch patterns such as ``prod.*`` or ``prod.analytics.*`` on the fully
  qualified, case-folded name):
  ``DROP`` (table, view, schema, database …) and ``TRUNCATE`` → deny
  ``sql_destructive_protected``; ``DELETE``/``UPDATE`` without a ``WHERE`` or with a trivially
  true one (``1=1``, ``TRUE``, ``x=x``, ``… OR 1=1``, a predicate naming no column) → deny
  ``sql_destructive_protected``; ``DELETE`` with a real predicate → require_approval
  ``sql_delete_protected``; ``UPDATE`` with a real predicate → require_approval
  ``sql_update_protected``; ``MERGE`` into it → require_approval ``sql_merge_protected``;
  ``ALTER … DROP COLUMN/PARTITION`` → deny ``sql_destructive_protected``, any other ``ALTER``
  → require_approval ``sql_alter_protected``; ``CREATE OR REPLACE`` over it and
  ``INSERT OVERWRITE`` into it → require_approval ``sql_replace_protected``;
- a schema, database or catalog is protected when a protected pattern could name something
  inside it (``DROP SCHEMA prod`` with ``prod.*``);
- ``DROP SCHEMA`` / ``DATABASE`` / ``CATALOG`` of any name → deny (``sql_destructive``, or
  ``sql_destructive_protected`` on a protected one): they take everything inside with them;
- functions with side effects: administrative ones (``pg_terminate_backend``,
  ``pg_cancel_backend``, ``pg_reload_conf``, ``set_config``, the file and large-object
  functions …) → deny ``sql_admin_function``; remote or dynamic execution (``dblink``,
  ``dblink_exec``, ``query_to_xml``; ``CREATE SERVER``, ``CREATE FOREIGN TABLE``, ``IMPORT FOREIGN
  SCHEMA``, ``CREATE USER MAPPING``) → deny ``sql_remote_execution``; a function called by a
  protected name (``prod.purge()``) → require_approval ``sql_protected_function``;
- session state: ``SET ROLE``, ``SET SESSION AUTHORIZATION`` and ``RESET`` → deny
  ``sql_session_state``; where names are protected, changing how they resolve (``SET
  search_path``, ``USE``) → deny ``sql_session_state``;
- a *read-only* role (``read_only``): anything but a read → deny ``sql_read_only`` (writes,
  ``nextval``), and every ``SET``, ``USE`` and ``BEGIN … READ WRITE`` → deny
  ``sql_session_state``;
- everything else (``SELECT``, writes to unprotected names, ``INSERT`` …) → allow ``sql_allowed``.

Name resolution: unqualified names are tried as written and, when the caller knows them, with the
session's default ``catalog`` and each schema of its ``search_path`` in front (``duckdb
prod.duckdb -c 'DROP TABLE t'`` drops ``prod.main.t``; with ``search_path: [prod]`` an
unqualified ``DELETE FROM users`` is ``prod.users``). Without a search path the dialect's default
schema is used (``main``, ``public``). DuckDB's two-part ``a.b`` may mean catalog ``a``, table
``b``, so both readings are tried. Matching is case-insensitive whatever the dialect's quoting
rules: treating ``"PROD"`` like ``prod`` can only protect more, never less.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from corral.policy.sqlverdict import SqlVerdict

__all__ = ["DIALECTS", "check_sql"]

DIALECTS = frozenset(
    {"duckdb", "postgres", "sqlite", "spark", "databricks", "hive", "trino", "presto",
     "bigquery", "snowflake", "mysql", "clickhouse", "redshift", "tsql", "oracle"}
)  # fmt: skip
"""Dialects accepted by `check_sql` (sqlglot's names)."""

DEFAULT_SCHEMA = {"duckdb": "main", "postgres": "public", "sqlite": "main", "redshift": "public"}
"""The schema an unqualified table lives in when the session does not say otherwise."""


def check_sql(
    sql: str,
    *,
    dialect: str = "duckdb",
    protected: Sequence[str] = (),
    catalog: str | None = None,
    schema: str | None = None,
    search_path: Sequence[str] = (),
    read_only: bool = False,
) -> SqlVerdict:
    """Decide on ``sql`` as ``dialect`` would run it. ``search_path``: the schemas (``s`` or
    ``catalog.s``) unqualified names resolve in, first to last (``schema``: a path of one).
    Pure; raises ValueError for a bad dialect."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown SQL dialect {dialect!r} (known: {', '.join(sorted(DIALECTS))})")
    path = tuple(search_path) or ((schema,) if schema else ())
    if not path and dialect in DEFAULT_SCHEMA:
        path = (DEFAULT_SCHEMA[dialect],)
    return _check(
        sql,
        dialect,
        tuple(p.lower() for p in protected),
        catalog.lower() if catalog else None,
        tuple(p.lower() for p in path),
        read_only,
    )


@functools.lru_cache(maxsize=2048)
def _check(
    sql: str,
    dialect: str,
    protected: tuple[str, ...],
    catalog: str | None,
    search_path: tuple[str, ...],
    read_only: bool,
) -> SqlVerdict:
    if "/*!" in sql:
        return SqlVerdict(
            "deny", "sql_unsupported", "executable comments (`/*! … */`) are not supported"
        )
    from corral.policy import sqltree  # sqlglot loads on the first SQL text, not at start-up

    return sqltree.judge(sql, dialect, protected, catalog, search_path, read_only)
