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
    (
        "duckdb",
        "select count(*) from prod.analytics.events where day = '2024-01-01'",
        "allow",
        "sql_allowed",
    ),
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
    ("duckdb", "DROP SCHEMA dev", "deny", "sql_destructive"),  # a container: refused anywhere
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
    (
        "duckdb",
        "DELETE FROM prod.t WHERE id = 3 AND 1 = 1",
        "require_approval",
        "sql_delete_protected",
    ),
    (
        "postgres",
        "DELETE FROM prod.t USING dev.u WHERE prod.t.id = dev.u.id",
        "require_approval",
        "sql_delete_protected",
    ),
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
    (
        "duckdb",
        "CREATE OR REPLACE TABLE prod.t AS SELECT 1",
        "require_approval",
        "sql_replace_protected",
    ),
    (
        "duckdb",
        "CREATE OR REPLACE VIEW prod.v AS SELECT 1",
        "require_approval",
        "sql_replace_protected",
    ),
    ("duckdb", "CREATE OR REPLACE TABLE dev.t AS SELECT 1", "allow", "sql_allowed"),
    (
        "spark",
        "INSERT OVERWRITE TABLE prod.t SELECT 1",
        "require_approval",
        "sql_replace_protected",
    ),
    (
        "duckdb",
        "MERGE INTO prod.t USING s ON t.a = s.a WHEN MATCHED THEN DELETE",
        "require_approval",
        "sql_merge_protected",
    ),
    # statements hidden inside other statements
    (
        "postgres",
        "WITH x AS (DELETE FROM prod.t RETURNING *) SELECT * FROM x",
        "deny",
        "sql_destructive_protected",
    ),
    (
        "postgres",
        "WITH x AS (DELETE FROM prod.t WHERE id = 1 RETURNING *) SELECT * FROM x",
        "require_approval",
        "sql_delete_protected",
    ),
    (
        "postgres",
        "WITH x AS (UPDATE prod.t SET a = 1 RETURNING *) SELECT 1",
        "deny",
        "sql_destructive_protected",
    ),
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


@pytest.mark.parametrize(
    ("sql", "catalog", "protected", "verdict"),
    [
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
        ("DROP TABLE prod.scratch.t", None, ("prod.analytics.*",), "allow"),
        ("DROP DATABASE prod", None, ("prod.analytics.*",), "deny"),
        ("DROP SCHEMA prod", None, ("prod.t*",), "deny"),
        # duckdb's two-part name may be catalog.table
        ("DROP TABLE prod.t", None, ("prod.main.*",), "deny"),
        # patterns are case-insensitive
        ("DROP TABLE prod.t", None, ("PROD.*",), "deny"),
        # nothing protected: destructive statements are allowed, structure is still checked
        ("DROP TABLE prod.t", None, (), "allow"),
        ("SELECT 1; SELECT 2", None, (), "deny"),
    ],
)
def test_name_resolution(
    sql: str, catalog: str | None, protected: tuple[str, ...], verdict: str
) -> None:
    v = check_sql(sql, dialect="duckdb", protected=protected, catalog=catalog)
    assert v.verdict == verdict, v.message


def test_postgres_default_schema_is_public() -> None:
    v = check_sql("DROP TABLE t", dialect="postgres", protected=("prod.public.*",), catalog="prod")
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


# --------------------------------------------------------------------------------------------
# Classes that a protected-name check alone let through
# --------------------------------------------------------------------------------------------

EVERYWHERE = [
    # (dialect, sql, reason): denied whether or not anything is protected
    ("postgres", "DROP DATABASE analytics", "sql_destructive"),
    ("postgres", "DROP DATABASE IF EXISTS scratch", "sql_destructive"),
    ("postgres", "DROP SCHEMA staging CASCADE", "sql_destructive"),
    ("duckdb", "DROP SCHEMA IF EXISTS tmp", "sql_destructive"),
    ("spark", "DROP DATABASE dev CASCADE", "sql_destructive"),
    ("postgres", "SELECT pg_terminate_backend(pid) FROM pg_stat_activity", "sql_admin_function"),
    ("postgres", "SELECT pg_cancel_backend(123)", "sql_admin_function"),
    ("postgres", "SELECT pg_reload_conf()", "sql_admin_function"),
    ("postgres", "SELECT pg_catalog.pg_reload_conf()", "sql_admin_function"),
    ("postgres", "SELECT set_config('log_statement', 'none', false)", "sql_admin_function"),
    ("postgres", "SELECT pg_read_file('/etc/passwd')", "sql_admin_function"),
    ("postgres", "SELECT lo_export(1, '/tmp/x')", "sql_admin_function"),
    (
        "postgres",
        "SELECT * FROM t WHERE pg_sleep(1) IS NULL AND pg_reload_conf()",
        "sql_admin_function",
    ),
    ("postgres", "SELECT dblink_exec('host=prod', 'DROP TABLE sales')", "sql_remote_execution"),
    (
        "postgres",
        "SELECT * FROM dblink('host=prod', 'DELETE FROM sales') AS t(a int)",
        "sql_remote_execution",
    ),
    ("postgres", "SELECT dblink_connect('c', 'host=x')", "sql_remote_execution"),
    (
        "postgres",
        "SELECT query_to_xml('DELETE FROM sales RETURNING 1', true, true, '')",
        "sql_remote_execution",
    ),
    ("postgres", "CREATE SERVER s FOREIGN DATA WRAPPER postgres_fdw", "sql_remote_execution"),
    ("postgres", "CREATE FOREIGN TABLE f (a int) SERVER s", "sql_remote_execution"),
    ("postgres", "CREATE USER MAPPING FOR me SERVER s", "sql_remote_execution"),
    ("postgres", "SET ROLE admin", "sql_session_state"),
    ("postgres", "SET SESSION AUTHORIZATION postgres", "sql_session_state"),
    ("postgres", "RESET ALL", "sql_session_state"),
    ("postgres", "RESET ROLE", "sql_session_state"),
]


@pytest.mark.parametrize(("dialect", "sql", "reason"), EVERYWHERE)
def test_denied_everywhere(dialect: str, sql: str, reason: str) -> None:
    for protected in ((), PROD):
        v = check_sql(sql, dialect=dialect, protected=protected)
        assert (v.verdict, v.reason) == ("deny", reason), (sql, v.message)


@pytest.mark.parametrize(
    ("sql", "verdict", "reason"),
    [
        ("SELECT prod.purge_old_rows(30)", "require_approval", "sql_protected_function"),
        ('SELECT "prod"."purge"()', "require_approval", "sql_protected_function"),
        ("SELECT * FROM t WHERE prod.is_stale(t.id)", "require_approval", "sql_protected_function"),
        ("SELECT dev.helper(1)", "allow", "sql_allowed"),
        ("SELECT lower(name) FROM prod.t", "allow", "sql_allowed"),
        ("SET search_path = prod", "deny", "sql_session_state"),
        ("SET search_path TO dev, prod", "deny", "sql_session_state"),
        ("SET statement_timeout = 5000", "allow", "sql_allowed"),
        ("SET TRANSACTION READ WRITE", "allow", "sql_allowed"),  # not a read-only role
    ],
)
def test_functions_and_session_where_names_are_protected(
    sql: str, verdict: str, reason: str
) -> None:
    v = check_sql(sql, dialect="postgres", protected=PROD)
    assert (v.verdict, v.reason) == (verdict, reason), v.message


def test_use_is_refused_where_names_are_protected() -> None:
    assert check_sql("USE prod", dialect="duckdb", protected=PROD).reason == "sql_session_state"
    assert check_sql("USE dev", dialect="duckdb").verdict == "allow"


READ_ONLY = [
    ("SELECT * FROM sales", "allow", "sql_allowed"),
    ("WITH x AS (SELECT 1) SELECT * FROM x", "allow", "sql_allowed"),
    ("BEGIN", "allow", "sql_allowed"),
    ("SELECT count(*) FROM sales", "allow", "sql_allowed"),
    ("SET TRANSACTION READ WRITE", "deny", "sql_session_state"),
    ("BEGIN READ WRITE", "deny", "sql_session_state"),
    ("SET default_transaction_read_only = off", "deny", "sql_session_state"),
    ("SET ROLE writer", "deny", "sql_session_state"),
    ("RESET default_transaction_read_only", "deny", "sql_session_state"),
    ("SET search_path = scratch", "deny", "sql_session_state"),
    ("INSERT INTO scratch.t VALUES (1)", "deny", "sql_read_only"),
    ("UPDATE scratch.t SET a = 1 WHERE b = 2", "deny", "sql_read_only"),
    ("CREATE TABLE scratch.t (a int)", "deny", "sql_read_only"),
    ("WITH d AS (DELETE FROM scratch.t RETURNING *) SELECT * FROM d", "deny", "sql_read_only"),
    ("SELECT nextval('orders_id_seq')", "deny", "sql_read_only"),
]


@pytest.mark.parametrize(("sql", "verdict", "reason"), READ_ONLY)
def test_a_read_only_role_only_reads(sql: str, verdict: str, reason: str) -> None:
    v = check_sql(sql, dialect="postgres", read_only=True)
    assert (v.verdict, v.reason) == (verdict, reason), v.message


@pytest.mark.parametrize(
    ("sql", "search_path", "catalog", "verdict"),
    [
        # the role's search path: an unqualified name on a protected schema is caught
        ("DELETE FROM users", ("prod",), None, "deny"),
        ("DELETE FROM users WHERE id = 1", ("prod",), None, "require_approval"),
        ("DELETE FROM users", ("scratch", "prod"), None, "deny"),  # any schema it may resolve in
        ("DELETE FROM users", ("scratch",), None, "allow"),
        ("DROP TABLE users", ("public",), "prod", "deny"),  # prod.public.users
        ("DROP TABLE users", ("prod.public",), None, "deny"),  # a catalog-qualified entry
        ("TRUNCATE users", ("prod",), None, "deny"),
    ],
)
def test_search_path_resolves_unqualified_names(
    sql: str, search_path: tuple[str, ...], catalog: str | None, verdict: str
) -> None:
    v = check_sql(sql, dialect="postgres", protected=PROD, search_path=search_path, catalog=catalog)
    assert v.verdict == verdict, v.message
