"""Change data capture from PostgreSQL into a table stream (docs/tables.md, "Change data capture")."""
