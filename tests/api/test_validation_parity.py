"""Property: the pipeline's validation of records that bypassed the API (Kafka records, converted
by `ingest.kafka_source.RecordConverter` on the executors) and `POST /api/v1/events` accept and
reject exactly the same events, with the same reasons, and an accepted event becomes the same
source row either way (event time, dimensions, values, distinct fields). No JVM: the converter
is the pure function the Spark job maps over each Arrow batch; the API runs over a real
embedded log whose records are read back by the embedded source's reader."""

from __future__ import annotations

import json
import math
import warnings

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from api.app import create_app
from api.context import ApiContext
from ingest.kafka_source import RECORD_SCHEMA, RecordConverter
from ingest.log import SqliteEventLog
from ingest.spark_source import read_slice
from store import SqlitePaneStore

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

STREAM = "orders"
PREFIX = "sketchboard."
T0 = 1_794_999_600_000

anything = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2),
    max_leaves=4,
)
times = st.one_of(
    st.integers(T0 - 10**9, T0 + 10**9),  # epoch ms
    st.integers(1_700_000_000, 1_800_000_000),  # epoch s
    st.floats(1.7e9, 1.8e9),
    st.integers(-(10**16), 10**16),  # outside 1970..9999 too
    st.sampled_from(["2026-11-18T10:00:00Z", "2026-11-18T10:00:00.123+01:00", "2026-11-18T10:00:00", "yesterday",
                     "", "1e3"]),
    anything,
)
labels = st.one_of(st.text(max_size=12), st.integers(-1000, 1000), st.sampled_from(["DE", "FR"]), st.just("x" * 1100),
                   anything)
numbers = st.one_of(st.floats(-1e6, 1e6), st.integers(-(10**6), 10**6), st.sampled_from([math.inf, math.nan, 10**400]),
                    st.text(max_size=4), anything)
FIELDS = {"time": times, "customer_id": labels, "country": labels, "payment_method": labels, "amount": numbers,
          "items": numbers, "coupon": anything}
# Most fields present (so most events are valid and the accepted path is exercised too).
an_event = st.fixed_dictionaries({}, optional=FIELDS) | st.fixed_dictionaries(
    {"time": st.integers(T0, T0 + 10**6), "customer_id": st.text(min_size=1, max_size=8)},
    optional={k: v for k, v in FIELDS.items() if k not in ("time", "customer_id")})
events = st.lists(st.one_of(an_event, an_event, an_event, anything), min_size=1, max_size=12)


def _json(raw) -> bytes:
    return json.dumps(raw).encode()  # NaN and Infinity as JSON's extensions, as Python's clients send them


def _order(row: tuple) -> str:
    # An absent value field reads as None beside numbers in other rows: compare by repr, a total order.
    return repr(row)


def row_of(r: dict) -> tuple:
    return (r["event_time"], tuple(r["dims"]), tuple(r["vals"]), tuple(r["ids"]))


class ApiOnALog:
    """The ingest API over a real embedded log and store, one for all the examples of a test
    (building the app is most of an example's time): each example's rows are the ones its own
    request appended, read back between the log's end offsets before and after it."""

    def __init__(self, root, catalog):
        self.stream = catalog.stream(STREAM)
        self.log = SqliteEventLog(root / "log.db")
        self.log.ensure_topic(self.stream)
        self.store = SqlitePaneStore(root / "store.db")
        self.client = TestClient(create_app(ApiContext(catalog=catalog, log=self.log, store=self.store)))

    def post(self, body: bytes) -> tuple:
        """(the answer to `body` posted as one JSON array, the source rows it appended)."""
        before = {p: o.end for p, o in self.log.offsets(STREAM).items()}
        answer = self.client.post(f"/api/v1/events?stream={STREAM}", content=body,
                                  headers={"Content-Type": "application/json"})
        rows = [r for p, o in self.log.offsets(STREAM).items()
                for b in read_slice(self.log, self.stream, p, before.get(p, o.start), o.end) for r in b.to_pylist()]
        return answer, rows

    def close(self) -> None:
        self.client.close()
        self.store.close()
        self.log.close()


@pytest.fixture(scope="module")
def api_on_a_log(tmp_path_factory, demo_catalog):
    api = ApiOnALog(tmp_path_factory.mktemp("parity"), demo_catalog)
    yield api
    api.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(raws=events)
def test_pipeline_and_api_accept_and_reject_the_same_events_for_the_same_reasons(raws, api_on_a_log, demo_catalog):
    # The API, with the events as one JSON array.
    answer, appended = api_on_a_log.post(b"[" + b",".join(map(_json, raws)) + b"]")
    assert answer.status_code == 200, answer.text
    api_rejected = {r["index"]: r["reason"] for r in answer.json()["rejected"]}
    api_rows = sorted((row_of(r) for r in appended), key=_order)

    # The pipeline, with each event as one Kafka record (offset = its index).
    records = pa.RecordBatch.from_pylist(
        [{"topic": PREFIX + STREAM, "partition": 0, "offset": i, "ingest_time": T0, "value": _json(raw)}
         for i, raw in enumerate(raws)], schema=RECORD_SCHEMA)
    rows = [r for b in RecordConverter(demo_catalog, PREFIX).convert(records) for r in b.to_pylist()]
    pipeline_rejected = {r["offset"]: r["error"] for r in rows if r["error_kind"] is not None}
    assert all(r["error_kind"] == "invalid" for r in rows if r["error"] is not None)
    pipeline_rows = sorted((row_of(r) for r in rows if r["error"] is None), key=_order)

    event(f"accepted: {'some' if pipeline_rows else 'none'}, rejected: {'some' if pipeline_rejected else 'none'}")
    assert pipeline_rejected == api_rejected
    assert answer.json()["accepted"] == len(raws) - len(api_rejected) == len(pipeline_rows)
    assert pipeline_rows == api_rows
