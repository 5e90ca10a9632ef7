"""The `patterns:` declaration: what it accepts, and a clear error with the line for each mistake."""

from __future__ import annotations

import pytest

from catalog.loader import ConfigError, parse_catalog
from tests.support.patterns import EXAMPLES_YAML

STREAMS = """\
streams:
  logins:
    key_field: user_id
    dimensions: [outcome, ip]
    values: [latency_ms]
  other:
    key_field: account
    dimensions: [outcome]
"""


def declare(pattern: str) -> str:
    return STREAMS + "patterns:\n" + pattern


GOOD_STEP = "      - {name: fail, stream: logins, where: {outcome: failure}}\n"


def test_the_examples_parse_with_their_quantifiers_and_measures():
    catalog = parse_catalog(EXAMPLES_YAML)
    stuffing = catalog.patterns[0]
    assert stuffing.steps[0].min_times == stuffing.steps[0].max_times == 5
    assert stuffing.within == 600_000 and stuffing.after_match == "skip_past_last"
    assert catalog.patterns[1].not_followed_by.within == 1_800_000
    assert catalog.patterns[3].measures["approved_amount"].field == "amount"


def test_quantifiers():
    text = declare("  - name: p\n    key: user_id\n    within: 1m\n    steps:\n"
                   "      - {name: a, stream: logins, times: [2, 4]}\n"
                   "      - {name: b, stream: logins, one_or_more: true, contiguity: next}\n"
                   "      - {name: c, stream: logins, optional: true}\n")
    a, b, c = parse_catalog(text).patterns[0].steps
    assert (a.min_times, a.max_times) == (2, 4)
    assert (b.min_times, b.max_times, b.contiguity) == (1, None, "next")
    assert (c.min_times, c.max_times) == (0, 1)


def test_a_string_field_compares_with_a_yaml_number_as_text():
    text = declare("  - name: p\n    key: user_id\n    steps:\n"
                   "      - {name: a, stream: logins, where: {outcome: 500}}\n")
    assert parse_catalog(text).patterns[0].steps[0].where == {"outcome": 500}


# (the pattern, the line of the mistake, the reason): tests/unit/test_defined_patterns.py checks the
# same reasons for patterns defined through the API.
MISTAKES = [
    ("  - name: p\n    key: user_id\n    steps:\n      - {name: a, stream: nowhere}\n",
     13, "patterns.0.steps.0.stream: unknown stream 'nowhere'"),
    ("  - name: p\n    key: account\n    steps:\n" + GOOD_STEP,
     11, "patterns.0.key: key 'account' is not a string field of stream 'logins'"),
    ("  - name: p\n    key: user_id\n    steps:\n      - {name: a, stream: logins, where: {colour: red}}\n",
     13, "patterns.0.steps.0.where.colour: 'colour' is not a field of stream 'logins'"),
    ("  - name: p\n    key: user_id\n    steps:\n      - {name: a, stream: logins, where: {outcome: {gt: 3}}}\n",
     13, "gt compares numbers, and 'outcome' is a string field"),
    ("  - name: p\n    key: user_id\n    steps:\n      - {name: a, stream: logins, where: {latency_ms: fast}}\n",
     13, "'fast' is not a number"),
    ("  - name: p\n    key: user_id\n    steps:\n      - {name: a, stream: logins, where: {ip: \"1\\0\"}}\n",
     13, "contains a NUL character or a lone surrogate, which no event's field can hold"),
    ("  - name: p\n    key: user_id\n    steps:\n      - {name: a, stream: logins, where: {ip: {like: x}}}\n",
     13, "unknown operator 'like'"),
    ("  - name: p\n    key: user_id\n    steps:\n      - {name: a, stream: logins, where: {ip: {in: []}}}\n",
     13, "`in` takes a non-empty list"),
    ("  - name: p\n    key: user_id\n    within: 1m\n    steps:\n" + GOOD_STEP
     + "      - {name: b, stream: logins, where: {ip: {same_as: later.ip}}}\n",
     15, "same_as names 'later', which is not an earlier step (earlier steps: fail)"),
    ("  - name: p\n    key: user_id\n    within: 1m\n    steps:\n" + GOOD_STEP
     + "      - {name: b, stream: logins, where: {ip: {same_as: fail.address}}}\n",
     15, "'address' is not a field of stream 'logins' (step 'fail')"),
    ("  - name: p\n    key: user_id\n    within: 1m\n    steps:\n" + GOOD_STEP
     + "      - {name: b, stream: logins, where: {ip: {same_as: fail.latency_ms}}}\n",
     15, "they can never be equal"),
    ("  - name: p\n    key: user_id\n    within: 1m\n    steps:\n" + GOOD_STEP + GOOD_STEP,
     15, "step 'fail' is declared twice"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP + "  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP,
     14, "pattern 'p' is declared twice"),
    ("  - name: p\n    key: user_id\n    steps: []\n", 12, "a pattern needs at least one step"),
    ("  - name: p\n    key: user_id\n    within: 1m\n    steps:\n"
     "      - {name: a, stream: logins, optional: true}\n",
     14, "every step is optional"),
    ("  - name: p\n    key: user_id\n    steps:\n      - {name: a, stream: logins, times: 2}\n",
     10, "`within` is required"),
    ("  - name: p\n    key: user_id\n    within: 1m\n    steps:\n      - {name: a, stream: logins, times: 0}\n",
     14, "times must be between 1 and 1000"),
    ("  - name: p\n    key: user_id\n    within: 1m\n    steps:\n      - {name: a, stream: logins, times: [3, 2]}\n",
     14, "times: [n, m] needs 1 <= n <= m"),
    ("  - name: p\n    key: user_id\n    within: 1m\n    steps:\n"
     "      - {name: a, stream: logins, times: 2, one_or_more: true}\n",
     14, "either `times` or `one_or_more`"),
    ("  - name: p\n    key: user_id\n    steps:\n      - {name: a, stream: logins, contiguity: soon}\n",
     13, "contiguity"),
    ("  - name: p\n    key: user_id\n    after_match: skip_to_next\n    steps:\n" + GOOD_STEP,
     12, "after_match"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP + "    not_followed_by: {name: x, stream: logins}\n",
     14, "within"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP
     + "    not_followed_by: {name: x, stream: nowhere, within: 5m}\n",
     14, "patterns.0.not_followed_by.stream: unknown stream 'nowhere'"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP + "    measures:\n      n: {count: nobody}\n",
     15, "'nobody' is not a step of the pattern"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP + "    measures:\n      n: {sum: fail.ip}\n",
     15, "'ip' is not a value field of stream 'logins'"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP + "    measures:\n      n: {count: fail, sum: fail.x}\n",
     15, "a measure is exactly one of"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP + "    dimensions: [nobody.ip]\n",
     14, "patterns.0.dimensions.0: pattern 'p': dimension 'nobody.ip' must name a field of a step as 'step.field'"
         " (steps: fail"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP + "    dimensions: [fail.colour]\n",
     14, "dimension 'fail.colour': 'colour' is not a string field of stream 'logins'"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP + "    dimensions: [fail.latency_ms]\n",
     14, "dimension 'fail.latency_ms': 'latency_ms' is not a string field of stream 'logins' (dimensions need"
         " strings"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP + "    dimensions: [fail.ip, ip]\n",
     14, "pattern 'p': dimensions 'fail.ip' and 'ip' would both be named 'ip'"),
    ("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP + "    measures:\n      ip: {count: fail}\n",
     10, "pattern 'p': dimension 'ip' has the name of a measure"),
]


@pytest.mark.parametrize("pattern, line, message", MISTAKES)
def test_each_mistake_is_reported_with_its_line(pattern, line, message):
    with pytest.raises(ConfigError) as caught:
        parse_catalog(declare(pattern), source="streams.yaml")
    text = str(caught.value)
    assert message in text
    assert f"streams.yaml: line {line}:" in text
    assert text.count("\n") == 0, "one mistake, one message"


def test_each_pattern_generates_a_matches_stream_with_a_count_metric_and_its_measures_as_values():
    catalog = parse_catalog(EXAMPLES_YAML)
    stream = catalog.streams["credential_stuffing_matches"]
    assert stream.derived_from == "logins" and stream.time_field == "decided_at"
    assert stream.values == ("first_failure", "attempts") and stream.allowed_lateness == 0
    assert catalog.metrics["credential_stuffing_matches"].value is None  # count and rate of matches
    assert catalog.metrics["credential_stuffing_matches_attempts"].value == "attempts"
    assert catalog.streams["abandoned_checkout_matches"].values == ()
    again = parse_catalog(EXAMPLES_YAML)  # a second parse generates the same (idempotent)
    assert again.streams == catalog.streams and again.metrics == catalog.metrics


def test_a_pattern_over_a_derived_stream_is_refused():
    text = declare("  - name: p\n    key: user_id\n    steps:\n" + GOOD_STEP
                   + "  - name: q\n    key: user_id\n    steps:\n      - {name: a, stream: p_matches}\n")
    with pytest.raises(ConfigError, match="stream 'p_matches' is derived; a pattern reads streams from the log"):
        parse_catalog(text)


def test_a_key_or_string_field_the_pipeline_does_not_carry_is_refused():
    streams = "streams:\n  s:\n    key_field: user_id\n    event_id_field: eid\n    distinct: [ip]\n    dimensions: [outcome]\n"
    with pytest.raises(ConfigError, match="key 'user_id' of stream 's' is not carried to the pipeline"):
        parse_catalog(streams + "patterns:\n  - name: p\n    key: user_id\n    steps:\n      - {name: a, stream: s}\n")
    with pytest.raises(ConfigError, match="'user_id' of stream 's' is not carried to the pipeline"):
        parse_catalog(streams + "patterns:\n  - name: p\n    key: ip\n    steps:\n"
                      "      - {name: a, stream: s, where: {user_id: u1}}\n")
    parse_catalog(streams + "patterns:\n  - name: p\n    key: eid\n    steps:\n      - {name: a, stream: s}\n")


def test_matches_have_the_first_step_stream_s_dimensions_but_the_key_and_late_by_default():
    catalog = parse_catalog(EXAMPLES_YAML)
    assert catalog.streams["credential_stuffing_matches"].dimensions == ("outcome", "ip", "late")
    assert catalog.streams["abandoned_checkout_matches"].dimensions == ("stage", "late")
    # The key is a dimension of the stream: not one of the matches' (a pane per key: the matches' page is for that).
    keyed = parse_catalog("streams:\n  s:\n    dimensions: [device, level]\npatterns:\n  - name: p\n    key: device\n"
                          "    steps:\n      - {name: a, stream: s}\n")
    assert keyed.streams["p_matches"].dimensions == ("level", "late")


def test_declared_dimensions_name_step_fields_and_change_the_definition_id():
    from catalog.defined_patterns import definition_id
    from patterns.plan import compile_pattern

    text = declare("  - name: p\n    key: user_id\n    within: 1m\n    steps:\n" + GOOD_STEP
                   + "      - {name: ok, stream: logins, where: {outcome: success}}\n"
                   + "    dimensions: [ok.outcome, ip, fail.user_id]\n")
    catalog = parse_catalog(text)
    pattern = catalog.patterns[0]
    assert catalog.streams["p_matches"].dimensions == ("outcome", "ip", "user_id", "late")
    plan = compile_pattern(pattern, catalog)
    assert plan.dimensions == (("outcome", 1, "outcome"), ("ip", 0, "ip"), ("user_id", 0, "user_id"))
    assert plan.kept_fields == (("ip", "user_id"), ("outcome",))  # what a run keeps to tell them
    bare = parse_catalog(text.replace("    dimensions: [ok.outcome, ip, fail.user_id]\n", "")).patterns[0]
    assert definition_id(bare) != definition_id(pattern)  # state built without them is not carried over
    assert "dimensions" not in bare.model_dump(exclude_defaults=True)  # ids of patterns without them are unchanged


def test_a_dimension_the_pipeline_does_not_carry_or_named_late_is_refused():
    streams = "streams:\n  s:\n    key_field: user_id\n    distinct: [ip]\n    dimensions: [late, outcome]\n"
    one_step = "patterns:\n  - name: p\n    key: ip\n    steps:\n      - {name: a, stream: s}\n"
    with pytest.raises(ConfigError, match="dimension 'a.user_id': 'user_id' of stream 's' is not carried to the"
                       " pipeline"):
        parse_catalog(streams + one_step + "    dimensions: [a.user_id]\n")
    with pytest.raises(ConfigError, match="'late' is the matches' own dimension"):
        parse_catalog(streams + one_step + "    dimensions: [a.late]\n")
    with pytest.raises(ConfigError, match="the first step's stream has a dimension 'late'"):
        parse_catalog(streams + one_step)
    assert parse_catalog(streams + one_step + "    dimensions: [outcome]\n").streams["p_matches"].dimensions == (
        "outcome", "late")


def test_a_pattern_name_is_as_long_as_its_generated_names_allow():
    # Without measures the longest generated name is <name>_matches: a 55-character name fits.
    pattern = "  - name: NAME\n    key: user_id\n    within: 10m\n    steps:\n" + GOOD_STEP
    assert f"{'p' * 55}_matches" in parse_catalog(declare(pattern.replace("NAME", "p" * 55))).metrics
    with pytest.raises(ConfigError) as info:
        parse_catalog(declare(pattern.replace("NAME", "p" * 56)), source="t.yaml")
    assert str(info.value) == (
        f"t.yaml: line 10: patterns.0.name: pattern name {'p' * 56!r} is too long for its derived stream and metric"
        f" names: '{'p' * 56}_matches' has 64 characters, at most 63 (shorten the name to at most 55)")


@pytest.mark.parametrize("times", ["true", "[true, 3]"])
def test_a_boolean_is_no_number_of_times(times):
    pattern = "  - name: p\n    key: user_id\n    within: 10m\n    steps:\n" \
              f"      - {{name: a, stream: logins, times: {times}}}\n" + GOOD_STEP
    with pytest.raises(ConfigError, match=r"line 14: patterns\.0\.steps\.0\.times: expected a whole number, not a boolean"):
        parse_catalog(declare(pattern), source="t.yaml")


@pytest.mark.parametrize(("literal", "number", "form"), [
    ("0123", 83, "YAML 1.1 octal"), ("0x1F", 31, "YAML 1.1 hexadecimal"),
    ("1_000", 1000, "YAML 1.1 drops the underscores"), ("1:30", 90, "YAML 1.1 base 60"),
])
def test_a_where_literal_yaml_reads_as_another_number_is_refused(literal, number, form):
    # As a number it would be compared as str(83) == '83', never matching the zip code '0123'.
    pattern = "  - name: p\n    key: user_id\n    within: 10m\n    steps:\n" \
              f"      - {{name: a, stream: logins, where: {{outcome: {literal}}}}}\n" + GOOD_STEP
    with pytest.raises(ConfigError) as info:
        parse_catalog(declare(pattern), source="t.yaml")
    assert str(info.value) == (f"t.yaml: line 14: {literal} is read as the number {number} ({form}):"
                               f" write {number}, or quote it ('{literal}') if it is text")
    quoted = parse_catalog(declare(pattern.replace(f"outcome: {literal}", f"outcome: '{literal}'")))
    assert quoted.patterns[0].steps[0].where == {"outcome": literal}
