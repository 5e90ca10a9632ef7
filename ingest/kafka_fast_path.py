"""The JVM-side fast path of Spark's Kafka source: records that are clearly valid events become
source rows in Spark SQL (`from_json` with the stream's schema plus checks), without a trip
through Python; every other record goes to the API's own validator in Python
(`ingest.kafka_source.RecordConverter`), which accepts or rejects it with the API's message.

The fast path never rejects anything: it only *vouches*. So the reasons of dead letters are the
API's by construction, and the one property to keep is that a vouched record is one the API
accepts, read to the same row (time, labels, numbers). Jackson (behind `from_json`) and
Python's `json` differ at the edges, so a record is vouched for only when its text rules every
difference out (cheap checks on the bytes, before any parse):

- a flat object: optional JSON whitespace, `{`, no other brace, no backslash, `}`, whitespace.
  Jackson ignores trailing text (`{...} x`, `{...}}`) where Python refuses it; without
  backslashes no key is escaped (so keys are matched literally below) and no string holds an
  escaped quote or a lone surrogate;
- valid UTF-8 (Python refuses invalid bytes; Spark would read them as U+FFFD);
- each declared field name appears at most once as `"name"` (Jackson and Python both keep the
  last of duplicate keys today, but nothing promises it);
- not near a JSON limit (ingest/json_limits.py): at most `max_string_chars` bytes (so no
  string or key can be longer), fewer `[` than `max_depth` (so nothing nests deeper), no run
  of 18 or more digits (nor `max_int_digits`: no integer near the limit, no float whose
  mantissa needs care) and no exponent of three digits (Python reads 1e400 as inf, which the
  limits refuse; Jackson skips it in an undeclared field);

and then the parse says the record is a valid event of its stream: `from_json` found no
malformed JSON (its corrupt-record column is null; `allowNonNumericNumbers` and
`allowSingleQuotes` off, as Python's reading of values); the event time is a JSON integer
(floats and RFC 3339 text go to Python, whose rounding and date parsing are the reference)
inside 1970..9999 (the token's first character, found by a regex on the flat text); the key
field is there; each label is at most 1 024 characters and 2 048 bytes and does not read like a float or an
array (Spark reads any token into a string column: strings, integers and booleans read as the
API's labels do, "12" and "true"; a float token, which the API refuses, comes out as "1.5" or
"1.0E10", so a label that looks like that goes to Python); each value is a number (a double
column takes JSON numbers only, and the strings "NaN"/"Infinity", which come out not finite).

Every check runs on every record (in the fast and in the slow branch): they are substring
searches and four short regexes per record, about as cheap as the parse itself.
"""

from __future__ import annotations

from catalog import Catalog, StreamDef
from catalog.times import EPOCH_MS_THRESHOLD, MAX_EVENT_TIME_MS
from ingest.events import MAX_ABS_VALUE, MAX_LABEL_BYTES, MAX_STRING_LENGTH
from ingest.json_limits import JsonLimits

FLAT_OBJECT = r"^[ \t\n\r]*\{[^{}\\]*\}[ \t\n\r]*$"
MAX_DIGIT_RUN = 17
# How Spark writes a float token or an array read into a string column (Double.toString, JSON text).
AMBIGUOUS_LABEL = r"^(\[|-?[0-9]+[.eE])"
CORRUPT = "corrupt-record"  # not a catalog field name (those are identifiers): no collision
# Jackson as Python's json reads values: no NaN/Infinity tokens, no single quotes.
FROM_JSON_OPTIONS = {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT, "allowNonNumericNumbers": "false",
                     "allowSingleQuotes": "false"}
_WS = "[ \\t\\n\\r]*"


def near_limit_pattern(limits: JsonLimits) -> str:
    """Text that may be near a number limit: a long run of digits, or a three-digit exponent."""
    digits = max(1, min(MAX_DIGIT_RUN + 1, limits.max_int_digits))
    return f"[0-9]{{{digits}}}|[eE][+-]?[0-9]{{3}}"


def token_pattern(name: str) -> str:
    """The first character of the value of key `name` in a flat object without backslashes
    (names are identifiers: nothing to escape)."""
    return f'"{name}"{_WS}:{_WS}(.)'


def has_fast_path(limits: JsonLimits) -> bool:
    """Limits so tight that no event passes them in the obvious form go to Python entirely."""
    return limits.max_depth >= 1 and limits.max_string_chars >= 2 and limits.max_int_digits >= 1


def json_schema(stream: StreamDef) -> str:
    """The stream's declared fields as from_json reads them: the time as an integer (anything else
    is a malformed record, for Python to judge), labels as text, values as doubles."""
    fields = [f"`{stream.time_field}` bigint"]
    fields += [f"`{name}` string" for name in stream.string_fields]
    fields += [f"`{name}` double" for name in stream.values]
    return ", ".join([*fields, f"`{CORRUPT}` string"])


ROW_COLUMNS = ("stream", "event_time", "dims", "vals", "ids")


def judge_records(records, catalog: Catalog, topics: dict[str, str], limits: JsonLimits):
    """The records with `vouched` (never null) and, where it is true, their source-row columns
    (stream, event_time, dims, vals, ids) read by the JVM; `value` is null on vouched rows (nothing
    left for Python to read there). `records` has the columns topic, partition, offset,
    ingest_time, value; `topics` maps topic -> stream. Each record is parsed once, with its
    stream's schema; one output keeps the source (Kafka) read once per batch."""
    from pyspark.sql import functions as F

    record_columns = records.columns
    if not has_fast_path(limits) or not topics:
        return records.select(*record_columns, F.lit(False).alias("vouched"),
                              *[F.lit(None).alias(c) for c in ROW_COLUMNS])
    text = F.col("value").cast("string")
    plain = (
        F.col("value").isNotNull()
        & (F.octet_length("value") <= F.lit(limits.max_string_chars))
        & F.expr("is_valid_utf8(value)")
        & text.rlike(FLAT_OBJECT)
        & ~text.rlike(near_limit_pattern(limits))
        & (_count(text, "[") < F.lit(limits.max_depth))
        & F.col("ingest_time").isNotNull()
    )
    parsed_columns = []
    for topic, name in sorted(topics.items()):
        stream = catalog.stream(name)
        once = F.lit(True)
        for field in _fields(stream):
            once = once & _at_most_once(f'"{field}"')
        parsed = F.when((F.col("topic") == topic) & plain & once,
                        F.from_json(text, json_schema(stream), FROM_JSON_OPTIONS))
        parsed_columns.append(parsed.alias(_parsed(name)))
    parsed = records.select(*record_columns, text.alias("text"), *parsed_columns)

    vouched = F.lit(False)
    rows = {c: None for c in ROW_COLUMNS}
    for topic, name in sorted(topics.items()):
        stream = catalog.stream(name)
        p = F.col(_parsed(name))
        mine = F.col("topic") == topic
        ok, event_time = _vouch(stream, p, F.col("text"))
        if stream.sent_time_field:  # its sent time and device are read by the Python validator
            ok = F.lit(False)
        vouched = F.when(mine, p.isNotNull() & ok).otherwise(vouched)
        row = {
            "stream": F.lit(stream.name),
            "event_time": event_time,
            "dims": F.array(*[F.coalesce(p[d], F.lit("")) for d in stream.dimensions]).cast("array<string>"),
            "vals": F.array(*[p[v] for v in stream.values]).cast("array<double>"),
            "ids": F.array(*[p[f] for f in stream.source_ids]).cast("array<string>"),
        }
        for column, value in row.items():
            rows[column] = F.when(mine, value) if rows[column] is None else rows[column].when(mine, value)
    judged = parsed.select(*record_columns, F.coalesce(vouched, F.lit(False)).alias("vouched"),
                           *[value.alias(column) for column, value in rows.items()])
    return judged.select(*[F.when(~F.col("vouched"), F.col(c)).alias(c) if c == "value" else c
                           for c in record_columns], "vouched", *[F.when(F.col("vouched"), F.col(c)).alias(c)
                                                                  for c in ROW_COLUMNS])


def split_records(records, catalog: Catalog, topics: dict[str, str], limits: JsonLimits):
    """(source rows of the records the JVM vouches for, the other records as they came): the two
    sides of `judge_records`, for tests and tools (the pipeline reads both sides in one pass)."""
    from pyspark.sql import functions as F

    judged = judge_records(records, catalog, topics, limits)
    fast = judged.where("vouched").select(
        "stream", F.col("partition").cast("int").alias("partition"), F.col("offset").cast("bigint").alias("offset"),
        F.col("event_time").cast("bigint").alias("event_time"), F.col("ingest_time").cast("bigint").alias("ingest_time"),
        "dims", "vals", "ids", F.lit(None).cast("string").alias("error"), F.lit(None).cast("string").alias("error_kind"),
        F.lit(None).cast("bigint").alias("sent_time"), F.lit(None).cast("string").alias("device"))
    slow = judged.where(~F.col("vouched")).select(*records.columns)
    return fast, slow


def vouched_batch(batch):
    """The vouched rows of an Arrow batch of `judge_records` as source rows (vectorised)."""
    import pyarrow as pa

    from ingest.source_rows import SOURCE_SCHEMA

    n = batch.num_rows
    columns = {"partition": batch.column("partition"), "offset": batch.column("offset"),
               "ingest_time": batch.column("ingest_time"), **{c: batch.column(c) for c in ROW_COLUMNS},
               "error": pa.nulls(n, pa.string()), "error_kind": pa.nulls(n, pa.string()),
               "sent_time": pa.nulls(n, pa.int64()), "device": pa.nulls(n, pa.string())}
    return pa.RecordBatch.from_arrays([columns[f.name].cast(f.type) for f in SOURCE_SCHEMA], schema=SOURCE_SCHEMA)


def _vouch(stream: StreamDef, p, text):
    """(the parsed record is a valid event of `stream`, its event time in epoch ms). One regex per
    record at most (the time's token): the checks run for every record, in both branches."""
    from pyspark.sql import functions as F

    t = p[stream.time_field]
    event_time = F.when(F.abs(t) >= F.lit(EPOCH_MS_THRESHOLD), t).otherwise(t * F.lit(1000))
    ok = (p[CORRUPT].isNull() & t.isNotNull() & event_time.between(0, MAX_EVENT_TIME_MS)
          # An integer token, not a string Spark might read as a number: Python's date parser judges those.
          & F.regexp_extract(text, token_pattern(stream.time_field), 1).rlike("[-0-9]"))
    for required in (stream.key_field, stream.event_id_field):
        if required:  # missing or null: Python's validator says why (an 'invalid' dead letter)
            ok = ok & p[required].isNotNull()
    for name in stream.string_fields:
        # Spark reads any token into a string column: a JSON string, integer or boolean reads as the
        # API's label does ("12", "true"); a float ("1.5", "1.0E10") or an array ("[1]") is refused by
        # the API, and a string that looks like one of those goes to Python as well.
        label = p[name]
        ok = ok & (label.isNull() | (~label.rlike(AMBIGUOUS_LABEL) & (F.char_length(label) <= F.lit(MAX_STRING_LENGTH))
                                     & (F.octet_length(label) <= F.lit(MAX_LABEL_BYTES))))
    for name in stream.values:
        # A double column takes JSON numbers only (a string or a boolean is a malformed record), and
        # "NaN"/"Infinity" strings, which come out not finite; past MAX_ABS_VALUE Python's validator says why.
        value = p[name]
        ok = ok & (value.isNull() | (~F.isnan(value) & (F.abs(value) <= F.lit(MAX_ABS_VALUE))))
    return ok, event_time


def _fields(stream: StreamDef) -> list[str]:
    return [stream.time_field, *stream.string_fields, *stream.values]


def _count(text, needle: str):
    """How many times `needle` occurs in `text` (no regex: a length difference)."""
    from pyspark.sql import functions as F

    return (F.length(text) - F.length(F.replace(text, F.lit(needle), F.lit("")))) / F.lit(len(needle))


def _at_most_once(needle: str):
    """`needle` (no quote of SQL's in it) occurs at most once in the record's text: two substring
    searches, no copy."""
    from pyspark.sql import functions as F

    text = "cast(value AS string)"
    return F.expr(f"locate('{needle}', {text}, instr({text}, '{needle}') + 1) = 0")


def _parsed(stream: str) -> str:
    return f"parsed-{stream}"


__all__ = ["FLAT_OBJECT", "FROM_JSON_OPTIONS", "has_fast_path", "json_schema", "judge_records",
           "near_limit_pattern", "split_records", "token_pattern", "vouched_batch"]
