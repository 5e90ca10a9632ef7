"""Closed sessions rolled up into panes by whole columns (aggregates/session_batch.py
`session_partials`) against the per-session roll-up it replaced: one KLL and one HLL sketch per
pane fed the pane's sessions in their order. Counts and n/sum/min/max identical; KLL quantiles
identical up to k items (exact mode) and within bounds past it; HLL estimates identical. Pure."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from aggregates.session_batch import session_partials
from sketches import HllSketch, KllSketch
from store.panes import pane_start
from store.sessions import Session, SessionColumns

K = 8  # small, so a pane of a few sessions compacts too
PANE = 60_000


def reference(closed: list[Session], pane_ms: int) -> dict[int, tuple]:
    panes: dict[int, list[Session]] = {}
    for s in closed:
        panes.setdefault(pane_start(s.first_ms, pane_ms), []).append(s)
    out = {}
    for start, sessions in panes.items():
        durations = [float(s.last_ms - s.first_ms) for s in sessions]
        events = [float(s.events) for s in sessions]
        hll = HllSketch(12)
        for s in sessions:
            hll.update(s.key)
        klls = []
        for xs in (durations, events):
            kll = KllSketch(K)
            for x in xs:
                kll.update(x)
            klls.append(kll)
        out[start] = (len(sessions), [(len(xs), sum(xs), min(xs), max(xs), kll)
                                      for xs, kll in zip((durations, events), klls, strict=True)],
                      hll.estimate().estimate)
    return out


sessions = st.lists(st.builds(lambda key, first, length, events: Session(key, first, first + length, events),
                              st.sampled_from(["", "a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]),
                              st.integers(-3 * PANE, 5 * PANE), st.integers(0, 10 * PANE), st.integers(1, 50)),
                    max_size=80)


@settings(max_examples=200, deadline=None)
@given(sessions, st.booleans())
@example([Session("a", -1, 5, 2), Session("b", -PANE, -PANE + 1, 1)], True)  # before 1970: the floor's pane
def test_the_columns_roll_up_what_a_sketch_per_pane_fed_session_by_session_did(closed, as_columns):
    given_sessions = SessionColumns([s.key for s in closed], [s.first_ms for s in closed],
                                    [s.last_ms for s in closed], [s.events for s in closed]) if as_columns else closed
    got = session_partials(given_sessions, "web_sessions", "user", PANE, lg_k=12, kll_k=K)
    want = reference(closed, PANE)
    assert [p.start_ms for p in got] == sorted(want)
    for p in got:
        count, stats, distinct = want[p.start_ms]
        assert (p.stream, p.end_ms - p.start_ms, dict(p.dims)) == ("web_sessions", PANE, {})
        assert p.data.count == count
        for name, (n, total, lo, hi, ref) in zip(("duration_ms", "events"), stats, strict=True):
            v = p.data.values[name]
            assert (v.n, v.sum, v.min, v.max) == (n, total, lo, hi)
            kll = KllSketch.from_bytes(v.kll)
            ranks = [i / 20 for i in range(21)]
            if n <= K:  # exact mode: every item kept, the same answers at every rank
                assert [kll.quantile(q).value for q in ranks] == [ref.quantile(q).value for q in ranks]
            else:  # compactions are random: within the range, the item count kept
                assert all(lo <= kll.quantile(q).value <= hi for q in ranks)
            sketch = kll._sketch
            assert (sketch.n, sketch.get_min_value(), sketch.get_max_value()) == (n, lo, hi)
        assert HllSketch.from_bytes(p.data.distincts["user"]).estimate().estimate == distinct
