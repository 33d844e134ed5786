"""The JSON Schema files under docs/reference/schemas/ are exactly what the models generate
(`corral schema --write docs/reference/schemas` rewrites them), so they never drift."""

from __future__ import annotations

from pathlib import Path

import jsonschema

from corral.schemas import published as schemas

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference" / "schemas"


def test_every_published_schema_equals_the_generated_one() -> None:
    published = {p.stem for p in DOCS.glob("*.json")}
    assert published == set(schemas.MODELS), (
        "run `corral schema --write docs/reference/schemas` and commit the result"
    )
    for name in schemas.MODELS:
        assert (DOCS / f"{name}.json").read_text() == schemas.schema_text(name), (
            f"{name}.json is stale: run `corral schema --write docs/reference/schemas`"
        )


def test_every_schema_is_a_valid_json_schema() -> None:
    for name in schemas.MODELS:
        jsonschema.Draft202012Validator.check_schema(schemas.json_schema(name))


def test_the_reference_page_names_every_schema() -> None:
    page = (DOCS.parent / "json-schema.md").read_text()
    missing = [name for name in schemas.MODELS if f"schemas/{name}.json" not in page]
    assert not missing, missing
