"""The knowledge flywheel's decisions, pure (no I/O): what a finished run teaches (extract.py),
how a learning scores and which tier it reaches (rubric.py), how its utility, confidence,
freshness and maturity move (lifecycle.py), and which learnings a new run is given within the
injection budget (retrieval.py). Formulas and numbers: seed 002 as fixed in
shared/reference/seed-semantics.md §1.2-1.7 and §5.5. Reading and writing the store is the
runtime's (runtime/flywheel.py) and the services' (services/knowledge.py)."""
