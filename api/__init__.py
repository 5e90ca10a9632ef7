"""The HTTP API: ingest, queries, progress."""
