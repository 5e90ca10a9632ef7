"""The PostgreSQL store backend (store_backend: postgres): the same tables and contract as
the embedded SQLite store, shared by the pipeline and several API processes."""

from store.postgres.panes import PostgresPaneStore, open_pool

__all__ = ["PostgresPaneStore", "open_pool"]
