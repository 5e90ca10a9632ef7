"""What a tier rebuild deletes before it rolls the panes up again (store/commit_plan.py
`tiers_kept_by_rebuild` says which tiers are kept): SQL over a DB-API connection, the same for
both backends (`p` is the backend's placeholder)."""

from __future__ import annotations


def drop_rows_to_rebuild(conn, p: str, stream: str, kept: set[tuple[int, str]], first_pane_ms: int | None) -> None:
    """Every row of a tier not kept; of a kept tier, the rows from the first pane on (rolled up
    again from the panes). With no panes, a kept tier's rows all stay: the rows before the first
    pane are the history past the panes' retention, which no rebuild could make again."""
    tiers = conn.execute(f"SELECT DISTINCT granule_ms, proj FROM tier_rows WHERE stream = {p}", (stream,)).fetchall()
    for granule, proj in tiers:
        if (granule, proj) not in kept:
            conn.execute(f"DELETE FROM tier_rows WHERE stream = {p} AND granule_ms = {p} AND proj = {p}",
                         (stream, granule, proj))
        elif first_pane_ms is not None:
            conn.execute(f"DELETE FROM tier_rows WHERE stream = {p} AND granule_ms = {p} AND proj = {p}"
                         f" AND start_ms >= {p}", (stream, granule, proj, first_pane_ms))
