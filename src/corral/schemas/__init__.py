"""The schemas at Corral's boundary: one pydantic model per JSON shape the edges exchange.

`views` holds what `--json` prints (and the HTTP API will answer), `protocol` the domain values
the core protocol carries; `epics` and `knowledge` their rooms' views. `published.MODELS`
names every published model; `published.json_schema(name)` is its JSON Schema, committed under
docs/reference/schemas/ (`corral schema --write`) and described in
docs/reference/json-schema.md. The package imports none of them itself, so a command that
prints jobs does not build the epics' models. This room sits just above the domain, so the
core, the store, the CLI and the HTTP API can all import it."""
