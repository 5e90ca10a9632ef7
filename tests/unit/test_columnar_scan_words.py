"""What our scanner (ingest/columnar_scan.py) reads 8 bytes at a time, against byte-by-byte
references: field names (`_named`, `_expected`, `_field`; the last word's bytes past the name
masked off, byte by byte where fewer than 8 bytes are left), for names of every length around the
word's (the streams of the other tests have names under 8 bytes); a label's plain run
(`_plain_until`), with its stops at every place in a word; and labels' bytes gathered into a column
(`_gather`), up to the body's last byte."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog.loader import parse_catalog
from ingest.columnar_scan import _LABEL_STOPS, _expected, _field, _gather, _plain_until, _plan, scanned_fields

names_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='"\\'), min_size=1, max_size=26)


@st.composite
def a_name_among(draw, names: list[str]) -> bytes:
    """A declared name, one byte off from one, cut short or run on, or any other."""
    name = draw(st.sampled_from(names)).encode()
    how = draw(st.sampled_from(["same", "one byte off", "shorter", "longer", "other"]))
    if how == "one byte off":
        at = draw(st.integers(0, len(name) - 1))
        return name[:at] + bytes([name[at] ^ draw(st.integers(1, 255))]) + name[at + 1:]
    if how == "shorter":
        return name[:draw(st.integers(0, len(name) - 1))]
    if how == "longer":
        return name + draw(st.binary(min_size=1, max_size=9))
    if how == "other":
        return draw(names_text).encode()
    return name


@settings(max_examples=800, deadline=None)
@given(data=st.data(), names=st.lists(names_text, min_size=1, max_size=6, unique=True),
       before=st.binary(max_size=9), after=st.binary(max_size=12))
def test_a_name_is_found_as_python_compares_it_whatever_its_length_and_place(data, names, before, after):
    candidate = data.draw(a_name_among(names))
    _, blob, name_ends, _ = _plan(names[0], tuple(names[1:]), ())
    body = np.frombuffer(before + candidate + after, np.uint8)  # `after` empty: the name ends the body
    start, length = len(before), len(candidate)
    encoded = [name.encode() for name in names]
    want = encoded.index(candidate) if candidate in encoded else -1
    assert _field(body, start, length, blob, name_ends) == want
    for field, name in enumerate(encoded):  # the name and its closing quote, where the scan expects `field`
        quoted = body[start:start + len(name) + 1].tobytes() == name + b'"'
        assert _expected(body, start, len(body), blob, name_ends, field) == (field if quoted else -1)


LONG = parse_catalog("""
streams:
  long_names:
    time_field: observed_at_in_milliseconds
    dimensions: [region_of_the_datacenter, k, endpoint]
    values: [latency_in_milliseconds, response_bytes_sent_to_the_client]
    partitions: 1
""").streams["long_names"]


@given(events=st.lists(st.fixed_dictionaries({
    "observed_at_in_milliseconds": st.integers(1_795_000_000_000, 1_795_000_100_000),
    "region_of_the_datacenter": st.sampled_from(["eu", "us-west", "ap-south-1"]),
    "k": st.text("ab z", max_size=3), "endpoint": st.sampled_from(["/", "/api/cart"]),
    "latency_in_milliseconds": st.floats(0, 1e4), "response_bytes_sent_to_the_client": st.integers(0, 10**9)}),
    min_size=1, max_size=20), order=st.permutations(range(6)), array=st.booleans())
def test_events_with_long_names_in_any_order_are_read_whole(events, order, array):
    keys = list(events[0])
    shuffled = [{keys[i]: e[keys[i]] for i in order} for e in events]
    body = json.dumps(shuffled, separators=(",", ":")) if array else "\n".join(
        json.dumps(e, separators=(",", ":")) for e in shuffled)
    read = scanned_fields(LONG, body.encode(), not array)
    assert read is not None
    columns, rows = read
    assert rows == len(events)
    assert {name: column.to_pylist() for name, column in columns.items()} == {
        name: [float(e[name]) if name.startswith(("latency", "response")) else e[name] for e in events]
        for name in keys}


# Mostly plain ASCII, with each kind of stop: a quote, a backslash, control characters (0x00, 0x1F)
# and bytes past ASCII (0x80, 0xFF); and the plain bytes next to them (0x20, 0x21, 0x23, 0x5B, 0x5D, 0x7F).
label_bytes = st.lists(st.one_of(st.integers(0x20, 0x7E), st.sampled_from(
    [0x22, 0x5C, 0x00, 0x1F, 0x80, 0xFF, 0x20, 0x21, 0x23, 0x5B, 0x5D, 0x7F])), max_size=40).map(bytes)


@settings(max_examples=1000, deadline=None)
@given(text=label_bytes, start=st.integers(0, 40))
def test_a_labels_plain_run_ends_at_the_first_stop_as_a_byte_by_byte_walk_finds_it(text, start):
    start = min(start, len(text))
    want = next((i for i in range(start, len(text)) if _LABEL_STOPS[text[i]]), len(text))
    assert _plain_until(np.frombuffer(text, np.uint8), start, len(text)) == want


@settings(max_examples=500, deadline=None)
@given(data=st.data(), body=st.binary(min_size=1, max_size=60))
def test_labels_are_gathered_whole_wherever_they_end_in_the_body(data, body):
    spans = data.draw(st.lists(st.tuples(st.integers(0, len(body)), st.integers(0, 20), st.booleans()), max_size=12))
    starts = np.array([start for start, _, _ in spans], np.int64)
    ends = np.array([min(len(body), start + length) for start, length, _ in spans], np.int64)
    present = np.array([there for _, _, there in spans], np.uint8)
    offsets, text = _gather(np.frombuffer(body, np.uint8), starts, ends, present, len(spans))
    labels = [body[start:end] if there else b"" for start, end, there in zip(starts, ends, present)]
    assert offsets.tolist() == [sum(map(len, labels[:i])) for i in range(len(labels) + 1)]
    assert text[:-8].tobytes() == b"".join(labels) and len(text) == offsets[-1] + 8
