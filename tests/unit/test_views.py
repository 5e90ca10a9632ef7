"""Table-table join views without Spark: the `views:` declaration and its load errors, and the
maintenance rule (aggregates/view_join.py) against a from-scratch pandas merge (Hypothesis)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.view_join import TableEdit, ViewShape, ViewState, apply, apply_all, from_scratch
from catalog import Catalog, ConfigError, parse_catalog

TABLES = """
streams:
  users:
    kind: table
    key_field: user_id
    dimensions: [plan_id, country]
    values: [credit]
  plans:
    kind: table
    key_field: id
    dimensions: [tier]
    values: [price]
  clicks:
    key_field: user_id
"""


def catalog_with(views: str) -> Catalog:
    return parse_catalog(TABLES + "views:\n" + views)


# -- catalog -------------------------------------------------------------------------------------


def test_a_view_adds_its_change_stream_and_survives_a_round_trip():
    catalog = catalog_with("  user_plans: {left: users, right: plans, foreign_key: plan_id, kind: left}\n")
    view = catalog.views["user_plans"]
    assert (view.left, view.right, view.foreign_key, view.kind) == ("users", "plans", "plan_id", "left")
    stream = catalog.streams["user_plans"]
    assert stream.dimensions == ("op", "plan_id", "country", "tier")
    assert stream.values == ("credit", "price")
    assert stream.derived_from == "users"
    assert Catalog.model_validate_json(catalog.model_dump_json()) == catalog
    # A metric over the view counts its changes like a table's.
    parse_catalog(TABLES + "views:\n  v: {left: users, right: plans, foreign_key: plan_id}\n"
                  "metrics:\n  v_changes: {stream: v, value: price}\n")
    assert catalog_with("  same_key: {left: users, right: plans}\n").views["same_key"].kind == "inner"


@pytest.mark.parametrize(("view", "line", "message"), [
    ("  v: {left: people, right: plans}", 16, "views.v.left: unknown table 'people' \\(tables: plans, users\\)"),
    ("  v: {left: users, right: clicks}", 16, "views.v.right: 'clicks' is an event stream"),
    ("  v: {left: users, right: plans, foreign_key: plan}", 16, "'plan' is not a dimension of table 'users'"),
    ("  v: {left: users, right: plans, kind: outer}", 16, "kind: Input should be 'inner' or 'left'"),
    ("  v: {left: users, right: users}", 16, "two different tables"),
    ("  v:\n    left: users\n    right: plans\n    join_on: x", 19, "join_on: Extra inputs are not permitted"),
    ("  users: {left: users, right: plans}", 16, "the name 'users' is already a stream"),
])
def test_bad_views_are_refused_naming_the_line_and_the_reason(view, line, message):
    with pytest.raises(ConfigError, match=f"line {line}: .*{message}"):
        catalog_with(view + "\n")


def test_a_column_in_both_tables_is_refused():
    config = TABLES.replace("dimensions: [tier]", "dimensions: [tier, country]")
    with pytest.raises(ConfigError, match="column 'country' is in both 'users' and 'plans'"):
        parse_catalog(config + "views:\n  v: {left: users, right: plans, foreign_key: plan_id}\n")


# -- the rule ------------------------------------------------------------------------------------

SHAPE = ViewShape(foreign_key="plan_id", inner=False, right_columns=("tier", "price"))


def test_the_kafka_streams_semantics_step_by_step():
    state = ViewState()
    up = lambda side, key, **row: apply(SHAPE, state, TableEdit(side, key, row, 1))  # noqa: E731
    assert [c.new for c in up("left", "u1", plan_id="p1", credit=1.0)] == [
        {"plan_id": "p1", "credit": 1.0, "tier": None, "price": None}]  # left join: no plan yet
    assert [c.new["tier"] for c in up("right", "p1", tier="gold", price=9.0)] == ["gold"]
    up("left", "u2", plan_id="p1", credit=2.0)
    # An update of the right row updates every left row pointing at it.
    assert [(c.key, c.new["price"]) for c in up("right", "p1", tier="gold", price=10.0)] == [("u1", 10.0),
                                                                                              ("u2", 10.0)]
    # A foreign key change retracts the old match and joins the new one: one change old -> new.
    up("right", "p2", tier="free", price=0.0)
    [moved] = up("left", "u1", plan_id="p2", credit=1.0)
    assert (moved.old["tier"], moved.new["tier"]) == ("gold", "free")
    assert state.index == {"p1": {"u2"}, "p2": {"u1"}}
    # A right delete leaves the left rows with empty right columns (left join) ...
    [emptied] = apply(SHAPE, state, TableEdit("right", "p1", None))
    assert emptied.key == "u2" and emptied.new["tier"] is None
    # ... and removes them in an inner join; a left delete removes its row; a no-op emits nothing.
    inner = ViewShape("plan_id", inner=True, right_columns=("tier", "price"))
    state = from_scratch(inner, {"u1": {"plan_id": "p1"}}, {"p1": {"tier": "gold", "price": 1.0}})
    assert apply(inner, state, TableEdit("right", "p1", {"tier": "gold", "price": 1.0})) == []
    [gone] = apply(inner, state, TableEdit("right", "p1", None))
    assert gone.new is None and state.rows == {}
    assert apply(inner, state, TableEdit("left", "u1", None)) == [] and state.index == {}


def pandas_view(shape: ViewShape, left: dict, right: dict) -> dict:
    """The view of the final tables, joined from scratch by pandas."""
    lf = pd.DataFrame([{"_lk": k, **r} for k, r in left.items()], columns=["_lk", "plan_id", "credit"])
    lf["_rk"] = lf["_lk"] if shape.foreign_key is None else lf["plan_id"].replace("", None)
    rf = pd.DataFrame([{"_rk": k, **r} for k, r in right.items()], columns=["_rk", "tier", "price"])
    merged = lf.merge(rf, on="_rk", how="inner" if shape.inner else "left")
    out = {}
    for rec in merged.to_dict("records"):
        out[rec["_lk"]] = {c: (None if isinstance(rec[c], float) and math.isnan(rec[c]) else rec[c])
                           for c in ("plan_id", "credit", "tier", "price")}
    return out


KEYS = st.sampled_from(["k1", "k2", "k3", "k4"])
EDITS = st.lists(st.one_of(
    st.builds(lambda k, fk, c: TableEdit("left", k, {"plan_id": fk, "credit": float(c)}), KEYS,
              st.sampled_from(["k1", "k2", "k3", ""]), st.integers(0, 5)),
    st.builds(lambda k, t, p: TableEdit("right", k, {"tier": t, "price": float(p)}), KEYS,
              st.sampled_from(["free", "gold", None]), st.integers(0, 5)),
    st.builds(lambda side, k: TableEdit(side, k, None), st.sampled_from(["left", "right"]), KEYS),
), max_size=40)


@settings(max_examples=300, deadline=None)
@given(edits=EDITS, inner=st.booleans(), on_key=st.booleans())
def test_the_maintained_view_equals_a_join_of_the_final_tables(edits, inner, on_key):
    shape = ViewShape(None if on_key else "plan_id", inner, ("tier", "price"))
    state = ViewState()
    changes = apply_all(shape, state, edits)
    left, right = {}, {}
    for e in edits:
        table = left if e.side == "left" else right
        if e.row is None:
            table.pop(e.key, None)
        else:
            table[e.key] = e.row
    assert state.rows == pandas_view(shape, left, right)
    # The changelog replayed from empty gives the same state, each change's old row the row before.
    replayed: dict = {}
    for c in changes:
        assert replayed.get(c.key) == c.old
        if c.new is None:
            del replayed[c.key]
        else:
            replayed[c.key] = c.new
    assert replayed == state.rows
    assert from_scratch(shape, left, right).rows == state.rows


@settings(max_examples=100, deadline=None)
@given(before=EDITS, batch=EDITS)
def test_the_rule_on_a_loaded_subset_matches_the_whole_state(before, batch):
    """What the pipeline does per batch: load only what the batch touches, apply, compare."""
    whole = ViewState()
    apply_all(SHAPE, whole, before)
    left_keys = {e.key for e in batch if e.side == "left"}
    left_keys |= {k for e in batch if e.side == "right" for k in whole.index.get(e.key, ())}
    right_keys = {e.key for e in batch if e.side == "right"}
    right_keys |= {whole.links[k] for k in left_keys if k in whole.links}
    right_keys |= {SHAPE.right_key(e.key, e.row) for e in batch if e.side == "left" and e.row} - {None}
    subset = from_scratch(SHAPE, {k: whole.left[k] for k in left_keys if k in whole.left},
                          {k: whole.right[k] for k in right_keys if k in whole.right})
    expected = apply_all(SHAPE, whole, batch)
    assert apply_all(SHAPE, subset, batch) == expected


def test_a_view_whose_change_stream_is_refused_is_reported_at_the_view():
    text = """\
streams:
  users: {kind: table, key_field: user_id, time_field: updated, dimensions: [plan]}
  plans: {kind: table, key_field: plan_id, dimensions: [tier, updated]}
views:
  user_plans: {left: users, right: plans, foreign_key: plan}
"""
    with pytest.raises(ConfigError) as info:
        parse_catalog(text, source="views.yaml")
    assert str(info.value) == (
        "views.yaml: line 5: views.user_plans: it generates the stream 'user_plans' (its change stream: the time"
        " field of users, the columns of both tables), which is refused: field 'updated' is declared twice"
        " (in time_field and dimensions)")
