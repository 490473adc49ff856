"""The embedded default database's Django backend: SQLite with its writers queued (base.py says why)."""
