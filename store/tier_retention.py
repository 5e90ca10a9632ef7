"""What a batch's commit drops of a stream's tier rows (each tier's own retention): SQL over a
DB-API connection, the same for both backends (`p` is the backend's placeholder)."""

from __future__ import annotations

from store.commit_plan import tier_rows_to_drop
from store.tiers import TierLayout


def drop_expired(conn, p: str, stream: str, layout: TierLayout, batch_now_ms: int) -> None:
    """Per tier, its rows wholly before batch_now - keep, found as a range of the rows' key."""
    for granule, proj, last_start, horizon in tier_rows_to_drop(layout, batch_now_ms):
        conn.execute(f"DELETE FROM tier_rows WHERE stream = {p} AND granule_ms = {p} AND proj = {p}"
                     f" AND start_ms <= {p} AND end_ms <= {p}", (stream, granule, proj, last_start, horizon))
