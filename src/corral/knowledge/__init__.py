"""The knowledge flywheel's decisions, pure (no I/O): what a finished run teaches (extract.py),
how a learning scores and which tier it reaches (rubric.py), how its utility, confidence,
freshness and maturity move (lifecycle.py), and which learnings a new run is given within the
injection budget (retrieval.py). Formulas and numbers: the AgentOps design as fixed in
docs/explanation/knowledge.md. Reading and writing the store is the
runtime's (runtime/flywheel.py) and the services' (services/knowledge.py)."""
