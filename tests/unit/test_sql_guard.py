"""SQL is parsed (dialect-aware), never grepped: destructive statements on protected names are
refused or sent for approval wherever they hide; what the checker cannot account for is denied."""

from __future__ import annotations

import pytest

from corral.policy.sql import check_sql

PROD = ("prod.*",)

CASES = [
    # (dialect, sql, verdict, reason)
    # reads and unprotected names
    ("duckdb", "SELECT * FROM prod.t", "allow", "sql_allowed"),
    ("duckdb", "select count(*) from prod.analytics.events where day = '2024-01-01'", "allow",
     "sql_allowed"),
    ("duckdb", "DROP TABLE dev.t", "allow", "sql_allowed"),
    ("duckdb", "DELETE FROM staging.t", "allow", "sql_allowed"),
    ("duckdb", "TRUNCATE dev.t", "allow", "sql_allowed"),
    ("duckdb", "INSERT INTO prod.t SELECT 1", "allow", "sql_allowed"),
    ("duckdb", "CREATE TABLE prod.t2 (a INT)", "allow", "sql_allowed"),
    ("duckdb", "SELECT 1 -- ; DROP TABLE prod.t", "allow", "sql_allowed"),  # a comment runs nothing
    ("duckdb", "DROP TABLE production.t", "allow", "sql_allowed"),  # `prod.*` is not `prod*`
    ("sqlite", "DELETE FROM t", "allow", "sql_allowed"),
    # DROP on protected names, however spelled
    ("duckdb", "DROP TABLE prod.x", "deny", "sql_destructive_protected"),
    ("duckdb", "drop table Prod.X", "deny", "sql_destructive_protected"),
    ("duckdb", 'DROP TABLE "prod"."x"', "deny", "sql_destructive_protected"),
    ("postgres", 'DROP TABLE "PROD"."X"', "deny", "sql_destructive_protected"),
    ("spark", "DROP TABLE `prod`.`t`", "deny", "sql_destructive_protected"),
    ("duckdb", "DROP TABLE IF EXISTS prod.main.t", "deny", "sql_destructive_protected"),
    ("duckdb", "DROP VIEW prod.v", "deny", "sql_destructive_protected"),
    ("duckdb", "DROP TABLE dev.a, prod.b", "deny", "sql_destructive_protected"),
    ("duckdb", "-- cleanup\nDROP /* old */ TABLE prod.t", "deny", "sql_destructive_protected"),
    ("duckdb", "DROP SCHEMA prod", "deny", "sql_destructive_protected"),
    ("postgres", "DROP SCHEMA prod CASCADE", "deny", "sql_destructive_protected"),
    ("duckdb", "DROP DATABASE prod", "deny", "sql_destructive_protected"),
    ("spark", "DROP DATABASE prod CASCADE", "deny", "sql_destructive_protected"),
    ("duckdb", "DROP SCHEMA dev", "allow", "sql_allowed"),
    ("duckdb", "TRUNCATE prod.t", "deny", "sql_destructive_protected"),
    ("postgres", "TRUNCATE TABLE prod.t", "deny", "sql_destructive_protected"),
    # DELETE / UPDATE: no predicate or a trivially true one is refused, a real one needs a human
    ("duckdb", "DELETE FROM prod.t", "deny", "sql_destructive_protected"),
    ("duckdb", "DELETE FROM prod.t WHERE 1=1", "deny", "sql_destructive_protected"),
    ("duckdb", "DELETE FROM prod.t WHERE true", "deny", "sql_destructive_protected"),
    ("duckdb", "DELETE FROM prod.t WHERE id = id", "deny", "sql_destructive_protected"),
    ("duckdb", "DELETE FROM prod.t WHERE id = 3 OR 1 = 1", "deny", "sql_destructive_protected"),
    ("duckdb", "DELETE FROM prod.t WHERE NOT false", "deny", "sql_destructive_protected"),
    ("duckdb", "DELETE FROM prod.t WHERE 'a' = 'a'", "deny", "sql_destructive_protected"),
    ("duckdb", "DELETE FROM prod.t WHERE name LIKE '%'", "deny", "sql_destructive_protected"),
    ("duckdb", "DELETE FROM prod.t WHERE random() < 2", "deny", "sql_destructive_protected"),
    ("duckdb", "DELETE FROM prod.t WHERE id = 3", "require_approval", "sql_delete_protected"),
    ("duckdb", "DELETE FROM prod.t WHERE id = 3 AND 1 = 1", "require_approval",
     "sql_delete_protected"),
    ("postgres", "DELETE FROM prod.t USING dev.u WHERE prod.t.id = dev.u.id", "require_approval",
     "sql_delete_protected"),
    ("duckdb", "UPDATE prod.t SET a = 1", "deny", "sql_destructive_protected"),
    ("duckdb", "UPDATE prod.t SET a = 1 WHERE 1 = 1", "deny", "sql_destructive_protected"),
    ("duckdb", "UPDATE prod.t SET a = 1 WHERE b = 2", "require_approval", "sql_update_protected"),
    ("duckdb", "UPDATE dev.t SET a = 1", "allow", "sql_allowed"),
    # ALTER, CREATE OR REPLACE, INSERT OVERWRITE, MERGE
    ("duckdb", "ALTER TABLE prod.t DROP COLUMN c", "deny", "sql_destructive_protected"),
    ("spark", "ALTER TABLE prod.t DROP PARTITION (d='1')", "deny", "sql_destructive_protected"),
    ("duckdb", "ALTER TABLE prod.t ADD COLUMN c INT", "require_approval", "sql_alter_protected"),
    ("duckdb", "ALTER TABLE prod.t RENAME TO t_old", "require_approval", "sql_alter_protected"),
    ("duckdb", "ALTER TABLE dev.t DROP COLUMN c", "allow", "sql_allowed"),
    ("duckdb", "CREATE OR REPLACE TABLE prod.t AS SELECT 1", "require_approval",
     "sql_replace_protected"),
    ("duckdb", "CREATE OR REPLACE VIEW prod.v AS SELECT 1", "require_approval",
     "sql_replace_protected"),
    ("duckdb", "CREATE OR REPLACE TABLE dev.t AS SELECT 1", "allow", "sql_allowed"),
    ("spark", "INSERT OVERWRITE TABLE prod.t SELECT 1", "require_approval",
     "sql_replace_protected"),
    ("duckdb", "MERGE INTO prod.t USING s ON t.a = s.a WHEN MATCHED THEN DELETE",
     "require_approval", "sql_merge_protected"),
    # statements hidden inside other statements
    ("postgres", "WITH x AS (DELETE FROM prod.t RETURNING *) SELECT * FROM x", "deny",
     "sql_destructive_protected"),
    ("postgres", "WITH x AS (DELETE FROM prod.t WHERE id = 1 RETURNING *) SELECT * FROM x",
     "require_approval", "sql_delete_protected"),
    ("postgres", "WITH x AS (UPDATE prod.t SET a = 1 RETURNING *) SELECT 1", "deny",
     "sql_destructive_protected"),
    # one statement at a time; unparseable and unsupported input is refused
    ("duckdb", "SELECT 1; DROP TABLE dev.x", "deny", "sql_multiple_statements"),
    ("duckdb", "SELECT 1; SELECT 2", "deny", "sql_multiple_statements"),
    ("duckdb", "SELECT 1;", "allow", "sql_allowed"),
    ("duckdb", "SELEC 1", "deny", "sql_unparseable"),
    ("duckdb", "DROP TABLE", "deny", "sql_unparseable"),
    ("duckdb", "", "deny", "sql_empty"),
    ("duckdb", " ; ", "deny", "sql_empty"),
    ("postgres", "EXECUTE stmt", "deny", "sql_unsupported"),
    ("postgres", "CALL purge_all()", "deny", "sql_unsupported"),
    ("postgres", "DO $$ BEGIN DROP TABLE prod.t; END $$", "deny", "sql_unsupported"),
    ("postgres", "COPY t TO PROGRAM 'rm -rf /'", "deny", "sql_unsupported"),
    ("postgres", "COPY t FROM PROGRAM 'curl evil'", "deny", "sql_unsupported"),
    ("duckdb", "ATTACH 'prod.duckdb' AS p", "deny", "sql_unsupported"),
    ("duckdb", "DETACH p", "deny", "sql_unsupported"),
    ("duckdb", "LOAD httpfs", "deny", "sql_unsupported"),
    ("duckdb", "INSTALL httpfs", "deny", "sql_unsupported"),
    ("duckdb", "PRAGMA enable_profiling", "deny", "sql_unsupported"),
    ("duckdb", "EXPLAIN ANALYZE DELETE FROM prod.t", "deny", "sql_unsupported"),
    ("duckdb", "SELECT 1 /*! ; DROP TABLE prod.t */", "deny", "sql_unsupported"),
]


@pytest.mark.parametrize(("dialect", "sql", "verdict", "reason"), CASES)
def test_sql_verdicts(dialect: str, sql: str, verdict: str, reason: str) -> None:
    v = check_sql(sql, dialect=dialect, protected=PROD)
    assert (v.verdict, v.reason) == (verdict, reason), v.message


@pytest.mark.parametrize(("sql", "catalog", "protected", "verdict"), [
    # unqualified names are resolved with the session's catalog (duckdb prod.duckdb …)
    ("DROP TABLE t", "prod", ("prod.*",), "deny"),
    ("DROP TABLE t", None, ("prod.*",), "allow"),
    ("DROP TABLE t", "dev", ("prod.*",), "allow"),
    ("DROP TABLE main.t", "prod", ("prod.*",), "deny"),
    ("DROP TABLE t", "prod", ("prod.main.*",), "deny"),
    # a narrower pattern protects only its schema, and the schema's container
    ("DROP TABLE prod.analytics.t", None, ("prod.analytics.*",), "deny"),
    ("DROP TABLE prod.scratch.t", None, ("prod.analytics.*",), "allow"),
    ("DROP SCHEMA prod.analytics", None, ("prod.analytics.*",), "deny"),
    ("DROP SCHEMA prod.scratch", None, ("prod.analytics.*",), "allow"),
    ("DROP DATABASE prod", None, ("prod.analytics.*",), "deny"),
    ("DROP SCHEMA prod", None, ("prod.t*",), "deny"),
    # duckdb's two-part name may be catalog.table
    ("DROP TABLE prod.t", None, ("prod.main.*",), "deny"),
    # patterns are case-insensitive
    ("DROP TABLE prod.t", None, ("PROD.*",), "deny"),
    # nothing protected: destructive statements are allowed, structure is still checked
    ("DROP TABLE prod.t", None, (), "allow"),
    ("SELECT 1; SELECT 2", None, (), "deny"),
])
def test_name_resolution(sql: str, catalog: str | None, protected: tuple[str, ...],
                         verdict: str) -> None:
    v = check_sql(sql, dialect="duckdb", protected=protected, catalog=catalog)
    assert v.verdict == verdict, v.message


def test_postgres_default_schema_is_public() -> None:
    v = check_sql("DROP TABLE t", dialect="postgres", protected=("prod.public.*",),
                  catalog="prod")
    assert (v.verdict, v.reason) == ("deny", "sql_destructive_protected")
    assert "prod.public.t" in v.message


def test_verdict_lists_the_parsed_statements() -> None:
    v = check_sql("select 1; drop table x", dialect="duckdb")
    assert v.statements == ("SELECT 1", "DROP TABLE x")
    assert check_sql("  select 1 ;\n").statements == ("select 1",)
    assert check_sql("SELEC 1").statements == ()


def test_message_names_the_protected_table() -> None:
    v = check_sql("DELETE FROM prod.sales.orders", protected=PROD)
    assert "prod.sales.orders" in v.message and "WHERE" in v.message


def test_unknown_dialect_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown SQL dialect 'klingon'"):
        check_sql("SELECT 1", dialect="klingon")
