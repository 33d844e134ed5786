"""Store adapters: in-memory, SQLite (the embedded default) and PostgreSQL, behind one port."""
