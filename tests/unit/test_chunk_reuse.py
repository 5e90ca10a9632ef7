"""Chunks of final windows (store/series.py _reusing_chunks), ungrouped and per group, reused
across ranges that move by a step, across processes (a new point cache over the chunks kept in the store) and across late
events that revise the rows under them: every answer equals what no cache computes and the
pane-level roll-up."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from store.final_points import FinalPoints
from store.point_cache import PointCache
from store.point_text import format_point, point_text
from tests.unit.test_tiers import LAYOUT, MINUTE, PANE, T0, answer, assert_same, batches, commit_all, pane_rollup, store_at

HOUR = 3_600_000


@st.composite
def views(draw) -> dict:
    step = draw(st.sampled_from([PANE, MINUTE]))  # chunks of 10 minutes, of an hour
    window = step * draw(st.sampled_from([1, 3, HOUR // step]))  # tumbling, hopping, 1 h sliding
    if draw(st.booleans()):
        window += PANE * draw(st.integers(1, 3))  # not a multiple of the step: gcd buckets
    start = T0 + step * draw(st.integers(-2, HOUR // step))
    end = start + step * draw(st.integers(60, 200))
    filters = draw(st.dictionaries(st.sampled_from("abc"), st.sampled_from("xypqrmn"), max_size=1))
    group_by = draw(st.sampled_from([[], [], ["a"], ["b", "c"]]))  # a group-by's chunks keep each group's points
    return dict(stat=draw(st.sampled_from(["p90", "distinct", "count", "avg"])), start=start, end=end, step=step,
                window=window, filters=filters, group_by=group_by)


def at_t0(batch_list: list[list[tuple]]) -> list[list[tuple]]:
    return [[(T0 + t, *rest) for t, *rest in events] for events in batch_list]


# After the first batches: the watermark past the three hours, so most chunks are final and the
# next batches are late events that revise them.
PAST = [[(T0 + 3 * HOUR + 10 * MINUTE, {"a": "x", "b": "p", "c": "m"}, 1.0, "u1")]]


# The window before a reused chunk is computed alone (the range asked again after a late batch
# elsewhere): its sum must be the one the whole range computes. Two panes in each of two 10 s
# buckets, whose sums by bucket and by pane's dimensions round apart (-137373.27500000002 against
# -137373.2749999999).
TWO_BUCKETS = [[(1_000, {"a": "x", "b": "p", "c": "m"}, 524560.165, "u1"),
                (2_000, {"a": "y", "b": "p", "c": "m"}, -995787.893, "u2"),
                (11_000, {"a": "x", "b": "p", "c": "m"}, -109225.612, "u3"),
                (12_000, {"a": "y", "b": "p", "c": "m"}, 443080.065, "u4")]]


# Values of 0.0 and -0.0 (round(-0.0001, 3)) in one window compare equal, so a KLL's sorted view
# holds whichever its merge order met first: the cached chunks answered p90 as 0.0 where the
# whole range answered -0.0 (Hypothesis drew it in CI). Min and max are asked of it too.
XPM = {"a": "x", "b": "p", "c": "m"}
ZEROS = [[(0, XPM, 0.0, "u0")]]
LATE_ZEROS = [[(0, XPM, 0.0, "u0")] * 5 + [(66_948, {"a": "y", "b": "r", "c": "n"}, 4.0, "u6"),
                                          (362_907, {"a": "x", "b": "p", "c": "n"}, -631664.551, "u14")],
              [(0, XPM, 0.0, "u0")] * 11 + [(480_000, XPM, 0.0, "u0"), (420_000, XPM, -0.0, "u0")]]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@example(first=TWO_BUCKETS, then=[[(2 * HOUR, {"a": "x", "b": "p", "c": "m"}, 1.0, "u1")]],
         asked=[dict(stat="avg", start=T0 - PANE, end=T0 + 600_000, step=PANE, window=3 * PANE, filters={"c": "m"},
                     group_by=[])], restart=False)
@example(first=ZEROS, then=LATE_ZEROS, restart=False,
         asked=[dict(stat="p90", start=T0, end=T0 + 10 * MINUTE, step=PANE, window=PANE, filters={}, group_by=[]),
                *(dict(stat=stat, start=T0 + MINUTE, end=T0 + HOUR + MINUTE, step=MINUTE, window=HOUR, filters={},
                       group_by=[]) for stat in ("p90", "min", "max"))])
@given(first=batches, then=batches, asked=st.lists(views(), min_size=1, max_size=3), restart=st.booleans())
def test_chunks_reused_across_ranges_processes_and_late_events_equal_what_no_cache_computes(
        store_backend, first, then, asked, restart):
    tiered, plain = store_at(store_backend, LAYOUT), store_at(store_backend, None)
    kept = FinalPoints(store_backend.side_db(tiered))
    cache = PointCache(backing=kept)
    try:
        for batch_list, offset in ((at_t0(first) + PAST, 0), (at_t0(then), len(first) + 1)):  # `then`: late
            for store in (tiered, plain):
                commit_all(store, batch_list, first_id=offset)
            for q in asked:
                for moved in (0, q["step"], 0):  # the range a step later, then back
                    ask = {**q, "start": q["start"] + moved, "end": q["end"] + moved}
                    got = answer(tiered, **ask, cache=cache)
                    assert_same(got, pane_rollup(plain, **ask), q["stat"])
                    uncached = answer(tiered, **ask)
                    assert got == uncached  # what no cache computes, to the text written of each point
                    assert [list(map(point_text, s.points)) for s in got] == [list(map(format_point, s.points))
                                                                            for s in uncached]
            if restart:  # a new process: nothing in memory, the chunks and points in the store
                kept.flush()
                cache = PointCache(backing=kept)
    finally:
        kept.close()
        tiered.close()
        plain.close()
