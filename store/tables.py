"""The serving store's tables, as SQLite DDL: the one definition of every table beside the side
stores'. The SQLite store creates them as written; the PostgreSQL store creates them through
store.postgres.schema.translate_ddl (BIGINT for INTEGER, BYTEA for BLOB, identity keys), so a
column added here lands in both backends. Columns added after a SQLite file may have been
created also need their ALTER in SqlitePaneStore._migrate.

A pane's and a tier row's sketches are a column of the row (`sketches`); stores made before
held them one row per (field, kind) in pane_sketches and tier_sketches (OLD_SKETCH_TABLES),
which both backends fold into the rows when they open such a store."""

from __future__ import annotations

from store.joins import JOIN_TABLES  # window joins' state (store/joins.py)
from store import view_state
from store.patterns import PATTERN_TABLES  # patterns' state, matches, late events (store/patterns.py)
from store.sessions import SESSION_TABLES  # open session windows (store/sessions.py)
from store import table_state, table_versions

# Panes, the change feed, batches, progress, dead letters, corrections, watermarks, offsets.
PANE_TABLES = """
-- A stream's dimension combinations, each numbered once (store/dim_sets.py): pane, tier and
-- change rows hold the number, not the ~100 bytes of JSON text.
CREATE TABLE IF NOT EXISTS dim_sets (
    stream TEXT NOT NULL,
    id INTEGER NOT NULL,
    dims TEXT NOT NULL,             -- dims_key of the combination
    PRIMARY KEY (stream, id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS dim_sets_by_text ON dim_sets (stream, dims);
CREATE TABLE IF NOT EXISTS panes (
    stream TEXT NOT NULL,
    start_ms INTEGER NOT NULL,
    dims_id INTEGER NOT NULL,       -- dim_sets.id
    end_ms INTEGER NOT NULL,
    count INTEGER NOT NULL,
    stats TEXT NOT NULL,            -- {value field: [n, sum, min, max]} (store/row_codec.py)
    revision INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    last_batch INTEGER NOT NULL,
    sketches BLOB NOT NULL,         -- every KLL and HLL of the pane, one blob (store/row_codec.py)
    PRIMARY KEY (stream, start_ms, dims_id)
) WITHOUT ROWID;  -- the key is most of a row: a rowid table kept it twice (table and index)
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    stream TEXT NOT NULL,
    start_ms INTEGER NOT NULL,
    dims_id INTEGER,                -- dim_sets.id of the changed pane
    dims TEXT,                      -- or the text itself (a switch's record: '{}')
    revision INTEGER NOT NULL,
    batch_id INTEGER NOT NULL,
    count_added INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    correction_id INTEGER           -- set when the change corrected a final pane
);
CREATE TABLE IF NOT EXISTS batches (
    pipeline TEXT NOT NULL,
    batch_id INTEGER NOT NULL,
    committed_at_ms INTEGER NOT NULL,
    events_read INTEGER NOT NULL,
    panes_new INTEGER NOT NULL,
    panes_updated INTEGER NOT NULL,
    PRIMARY KEY (pipeline, batch_id)
);
-- Each pipeline's batches summed as they are committed (store/batch_totals.py: progress reads them
-- every second, where a sum of `batches` scanned every batch ever committed).
CREATE TABLE IF NOT EXISTS batch_totals (
    pipeline TEXT PRIMARY KEY,
    batches INTEGER NOT NULL,       -- batches committed
    events_read INTEGER NOT NULL,   -- their events_read, summed
    last_batch_id INTEGER NOT NULL, -- the highest batch id
    last_commit_ms INTEGER NOT NULL -- the latest committed_at_ms
);
CREATE TABLE IF NOT EXISTS stream_progress (
    stream TEXT PRIMARY KEY,
    watermark_ms INTEGER,
    max_event_ms INTEGER,
    events_aggregated INTEGER NOT NULL DEFAULT 0,
    events_read INTEGER NOT NULL DEFAULT 0,          -- = events_aggregated + events_dead_lettered
    events_dead_lettered INTEGER NOT NULL DEFAULT 0,
    held_by_partition INTEGER       -- the partition holding the watermark back (store/watermarks.py)
);
CREATE TABLE IF NOT EXISTS dead_letter_counts (
    stream TEXT NOT NULL,
    reason TEXT NOT NULL,
    count INTEGER NOT NULL,
    PRIMARY KEY (stream, reason)
);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    pipeline TEXT NOT NULL,
    batch_id INTEGER NOT NULL,
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    "offset" INTEGER NOT NULL,
    reason TEXT NOT NULL,
    event_time_ms INTEGER,
    ingest_time_ms INTEGER,
    error TEXT,
    dims TEXT,
    at_ms INTEGER NOT NULL,
    clock_correction_ms INTEGER     -- added to event_time_ms by the device clock rule (null: none)
);
CREATE UNIQUE INDEX IF NOT EXISTS dead_letters_by_offset ON dead_letters (pipeline, stream, partition, "offset");
CREATE INDEX IF NOT EXISTS dead_letters_by_reason ON dead_letters (stream, reason, id);
CREATE INDEX IF NOT EXISTS dead_letters_by_time ON dead_letters (stream, at_ms);
CREATE TABLE IF NOT EXISTS corrections (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    stream TEXT NOT NULL,
    pane_start_ms INTEGER NOT NULL,
    pane_end_ms INTEGER NOT NULL,
    dims TEXT NOT NULL,
    revision_from INTEGER NOT NULL,
    revision_to INTEGER NOT NULL,
    pipeline TEXT NOT NULL,
    batch_id INTEGER NOT NULL,
    events_added INTEGER NOT NULL,
    at_ms INTEGER NOT NULL,
    old TEXT NOT NULL,              -- {"count", "values": {field: {n, sum, min, max}}, "distinct": {field: estimate}}
    new TEXT NOT NULL
);
-- By pane and then publication time: what an alert's `corrections_since` counts (PaneStore.count_corrections:
-- a window's corrections after a decision) is read from the index alone, not from rows that carry their old
-- and new stats (~15 times faster for a window of 50 000). It replaces the index by pane alone.
DROP INDEX IF EXISTS corrections_by_pane;
CREATE INDEX IF NOT EXISTS corrections_by_pane_time ON corrections (stream, pane_start_ms, at_ms);
-- Per-partition watermarks (store/watermarks.py): each partition's mark and its state at the last commit.
CREATE TABLE IF NOT EXISTS partition_watermarks (
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    max_event_ms INTEGER,
    read_offset INTEGER NOT NULL,
    log_end_offset INTEGER,
    last_progress_ms INTEGER NOT NULL,
    state TEXT NOT NULL,
    PRIMARY KEY (stream, partition)
);
-- Device clock estimates (aggregates/device_clocks.py), written with the batch that changed them.
CREATE TABLE IF NOT EXISTS device_clocks (
    stream TEXT NOT NULL,
    device TEXT NOT NULL,
    buckets TEXT NOT NULL,          -- [[receive-time bucket start ms, smallest received - sent ms], ...]
    offset_ms INTEGER NOT NULL,     -- the estimate: the smallest of the buckets'
    correction_ms INTEGER NOT NULL, -- what the device's event times get added (0: left alone)
    newest_ms INTEGER NOT NULL,     -- the newest bucket's start
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (stream, device)
);
CREATE TABLE IF NOT EXISTS pipeline_offsets (
    pipeline TEXT NOT NULL,
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    end_offset INTEGER NOT NULL,
    PRIMARY KEY (pipeline, stream, partition)
);
"""

# The roll-up tiers (store/tiers.py).
TIER_TABLES = """
CREATE TABLE IF NOT EXISTS tier_layouts (
    stream TEXT PRIMARY KEY,
    layout TEXT NOT NULL            -- TierLayout.to_json(): what tier_rows holds for the stream
);
-- The coarser tiers' fold point (store/tier_folds.py): their rows hold the panes starting before it.
CREATE TABLE IF NOT EXISTS tier_folds (
    stream TEXT PRIMARY KEY,
    folded_ms BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS tier_rows (
    stream TEXT NOT NULL,
    granule_ms INTEGER NOT NULL,
    proj TEXT NOT NULL,             -- '*' all dimensions, '' the total, 'a,b' a group-by
    start_ms INTEGER NOT NULL,
    dims_id INTEGER NOT NULL,       -- dim_sets.id of the projected dimensions
    end_ms INTEGER NOT NULL,
    count INTEGER NOT NULL,
    stats TEXT NOT NULL,            -- {value field: [n, sum, min, max]}
    revision INTEGER NOT NULL,      -- the highest revision of the panes it covers
    updated_at_ms INTEGER NOT NULL,
    last_batch INTEGER NOT NULL,
    sketches BLOB NOT NULL,         -- every KLL and HLL of the row, one blob (store/row_codec.py)
    PRIMARY KEY (stream, granule_ms, proj, start_ms, dims_id)
);  -- a rowid table: a coarse row's sketches are kilobytes, which a WITHOUT ROWID b-tree spills to overflow pages
"""

# The rows of both tables that hold pane-shaped rows, each with the table its sketches were
# kept in before they became the rows' `sketches` column, and its key (then: the dimensions text).
OLD_SKETCH_TABLES = {
    "panes": ("pane_sketches", ("stream", "start_ms", "dims")),
    "tier_rows": ("tier_sketches", ("stream", "granule_ms", "proj", "start_ms", "dims")),
}

# The tables whose rows held their dimensions as text before dim_sets numbered them (and their
# stats as {field: {n, sum, min, max}}), as they were made then: what a store of then is
# migrated from when it is opened (store/dims_migration.py).
TEXT_DIMS_TABLES = """
CREATE TABLE IF NOT EXISTS panes (
    stream TEXT NOT NULL, start_ms INTEGER NOT NULL, dims TEXT NOT NULL, end_ms INTEGER NOT NULL,
    count INTEGER NOT NULL, stats TEXT NOT NULL, revision INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL,
    last_batch INTEGER NOT NULL, sketches BLOB NOT NULL, PRIMARY KEY (stream, start_ms, dims)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS tier_rows (
    stream TEXT NOT NULL, granule_ms INTEGER NOT NULL, proj TEXT NOT NULL, start_ms INTEGER NOT NULL,
    dims TEXT NOT NULL, end_ms INTEGER NOT NULL, count INTEGER NOT NULL, stats TEXT NOT NULL,
    revision INTEGER NOT NULL, updated_at_ms INTEGER NOT NULL, last_batch INTEGER NOT NULL, sketches BLOB NOT NULL,
    PRIMARY KEY (stream, granule_ms, proj, start_ms, dims)
);
CREATE TABLE IF NOT EXISTS changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL, start_ms INTEGER NOT NULL, dims TEXT NOT NULL,
    revision INTEGER NOT NULL, batch_id INTEGER NOT NULL, count_added INTEGER NOT NULL, at_ms INTEGER NOT NULL,
    correction_id INTEGER
);
"""


def table_ddl(name: str, ddl: str | None = None) -> str:
    """The CREATE TABLE statement of one table of STORE_TABLES (or of `ddl`): a migration rebuilding it."""
    ddl = STORE_TABLES if ddl is None else ddl
    start = ddl.index(f"CREATE TABLE IF NOT EXISTS {name} (")
    return ddl[start:ddl.index(";", start) + 1]


# Bloom filter chunks and first-seen counts (store/bloom.py).
BLOOM_TABLES = """
CREATE TABLE IF NOT EXISTS bloom_filters (
    stream TEXT NOT NULL,
    kind TEXT NOT NULL,              -- 'first_seen' or 'membership'
    bucket_ms INTEGER NOT NULL,      -- membership: start of the event-time bucket; first_seen: 0
    m INTEGER NOT NULL,
    k INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    bits_set INTEGER NOT NULL,
    updated_batch INTEGER NOT NULL,
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (stream, kind, bucket_ms, m, k, seed)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bloom_chunks (
    stream TEXT NOT NULL,
    kind TEXT NOT NULL,
    bucket_ms INTEGER NOT NULL,
    m INTEGER NOT NULL,
    k INTEGER NOT NULL,
    seed INTEGER NOT NULL,
    chunk INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (stream, kind, bucket_ms, m, k, seed, chunk)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS first_seen (
    stream TEXT NOT NULL,
    start_ms INTEGER NOT NULL,
    end_ms INTEGER NOT NULL,
    new_keys INTEGER NOT NULL,       -- keys whose earliest event is in this pane, not in the filter before
    tested INTEGER NOT NULL,         -- keys tested against the filter for this pane
    positives INTEGER NOT NULL,      -- of those, answered "seen before" (some may be false positives)
    expected_fp REAL NOT NULL,       -- sum over batches of tested * fpp: expected false positives
    bound INTEGER NOT NULL,          -- sum over batches of the per-batch undercount bound
    updated_at_ms INTEGER NOT NULL,
    last_batch INTEGER NOT NULL,
    PRIMARY KEY (stream, start_ms)
) WITHOUT ROWID;
"""

TABLE_STATE_TABLES = table_state.DDL + table_versions.DDL + table_versions.MISSES_DDL
VIEW_STATE_TABLES = view_state.DDL  # table-table join views (store/view_state.py)

# Exact duplicate drops by event id (store/event_ids.py).
EVENT_ID_TABLES = """
CREATE TABLE IF NOT EXISTS seen_event_ids (
    stream TEXT NOT NULL,
    event_id TEXT NOT NULL,
    ingest_ms INTEGER NOT NULL,     -- ingest time of the copy counted: later copies within the window are dropped
    PRIMARY KEY (stream, event_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS seen_event_ids_by_time ON seen_event_ids (stream, ingest_ms);
CREATE TABLE IF NOT EXISTS event_id_partitions (
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    read_ingest_ms INTEGER NOT NULL, -- the newest ingest time read from the partition (the pruning horizon's input)
    PRIMARY KEY (stream, partition)
);
CREATE TABLE IF NOT EXISTS duplicate_counts (
    stream TEXT PRIMARY KEY,
    count INTEGER NOT NULL          -- events dropped as duplicates of an event id counted before
);
"""

STORE_TABLES = (PANE_TABLES + TIER_TABLES + BLOOM_TABLES + EVENT_ID_TABLES + JOIN_TABLES + TABLE_STATE_TABLES
                + VIEW_STATE_TABLES)
STORE_TABLES += PATTERN_TABLES
STORE_TABLES += SESSION_TABLES
