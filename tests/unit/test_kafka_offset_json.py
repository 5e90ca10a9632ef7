"""Spark's Kafka offsets as the text Spark writes (ingest/kafka_offset_json.py): Java's String
hash, the Scala 2.13 hash map's iteration order (buckets, growth), and a line Spark 4 itself wrote
to a query's offset log, reproduced byte for byte. Pure: no Spark, no broker (tests/spark/
test_pipeline.py checks every line Spark writes in its Kafka stop-and-restart test)."""

from __future__ import annotations

import json

from hypothesis import given, strategies as st

from ingest.kafka_offset_json import java_string_hash, scala_hash_map_order, spark_offsets_json


# Written by Spark 4 itself (spark-sql-kafka-0-10 4.2, Scala 2.13) to a query's offset log, batch 0
# of tests/spark/test_pipeline.py's stop-and-restart test on Kafka: the demo's 16 topics (the hash
# table grown to 32 buckets), in Spark's order.
SPARK_WROTE = (
    '{"ta4da405f87.mobile_app_sessions":{"0":0},"ta4da405f87.clicks":{"0":0,"1":0},"ta4da405f87.crede'
    'ntial_stuffing_matches":{"0":0},"ta4da405f87.logins":{"0":0,"1":0},"ta4da405f87.http_requests_se'
    'ssions":{"0":0},"ta4da405f87.user_plans":{"0":0},"ta4da405f87.mobile_app":{"0":0,"1":0},"ta4da40'
    '5f87.users":{"0":0,"1":0},"ta4da405f87.searches":{"0":0,"1":0},"ta4da405f87.checkout_abandoned_m'
    'atches":{"0":0},"ta4da405f87.checkouts":{"0":0,"1":0},"ta4da405f87.orders":{"0":0,"1":0},"ta4da4'
    '05f87.http_requests":{"0":986,"1":1004,"2":999,"3":1010},"ta4da405f87.plans":{"0":0},"ta4da405f8'
    '7.search_clicks":{"0":0},"ta4da405f87.mobile_app_clocks":{"0":0}}'
)


def test_a_line_spark_wrote_is_reproduced_byte_for_byte():
    assert spark_offsets_json(json.loads(SPARK_WROTE)) == SPARK_WROTE
    assert list(json.loads(SPARK_WROTE)) != sorted(json.loads(SPARK_WROTE))  # what we wrote before: sorted


def test_java_string_hash_matches_javas():
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -2**31  # overflow: Integer.MIN_VALUE
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00  # UTF-16 code units, not code points


def test_small_ints_iterate_in_ascending_order_and_strings_by_bucket():
    assert scala_hash_map_order([0, 1, 2, 3], lambda p: p) == [0, 1, 2, 3]
    assert scala_hash_map_order([3, 17, 1], lambda p: p) == [1, 17, 3]  # 16 buckets: 17 lands in bucket 1
    # "a" hashes to 97 (bucket 1), "b" to 98 (bucket 2), "a." to 3053 (bucket 13): not sorted by name.
    assert scala_hash_map_order(["a.", "a", "b"], java_string_hash) == ["a", "b", "a."]


def test_the_table_grows_when_a_put_finds_it_three_quarters_full_even_an_update():
    # Ten keys then the 11th: 16 buckets (17 is in bucket 1, after 1's hash-sorted neighbours).
    keys = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17]
    assert scala_hash_map_order(keys, lambda p: p) == [1, 17, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    # One more put of a key already there: size + 1 >= 12 grows the table to 32: 17 gets its own bucket.
    assert scala_hash_map_order(keys + [17], lambda p: p) == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17]


def test_equal_hashes_keep_the_order_they_were_put_in():
    assert java_string_hash("Aa") == java_string_hash("BB")
    assert scala_hash_map_order(["BB", "Aa"], java_string_hash) == ["BB", "Aa"]
    assert spark_offsets_json({"BB": {0: 1}, "Aa": {0: 2}}).startswith('{"Aa"')  # put sorted by topic


@given(st.dictionaries(st.from_regex(r"[a-z0-9._-]{1,12}", fullmatch=True),
                       st.dictionaries(st.integers(0, 40), st.integers(0, 2**40), min_size=1), max_size=30))
def test_the_text_is_compact_json_of_the_same_offsets(offsets):
    text = spark_offsets_json(offsets)
    assert " " not in text
    assert json.loads(text) == {t: {str(p): o for p, o in parts.items()} for t, parts in offsets.items()}


def test_offsets_read_back_from_json_give_the_same_text():
    offsets = {"t.users": {0: 73}, "t.http_requests": {0: 9, 1: 8}}
    text = spark_offsets_json(offsets)
    assert spark_offsets_json(json.loads(text)) == text
