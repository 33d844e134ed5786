"""Fixtures shared by every test room."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.pg import PgSchemas


@pytest.fixture
def pg_schemas() -> Iterator[PgSchemas]:
    """Fresh PostgreSQL schemas on the test server, dropped after the test."""
    schemas = PgSchemas()
    try:
        yield schemas
    finally:
        schemas.drop_all()
