"""A stop asked for while Spark's JVM stops with the same signal is a clean stop (sketchboard/live.py)."""

import logging

from sketchboard.live import _stopped_with_spark


class _JavaErrorOfAGoneJvm(Exception):
    """As py4j's Py4JJavaError once the JVM is gone: its text is asked of the JVM, and that call fails."""

    def __str__(self) -> str:
        raise ConnectionRefusedError(111, "Connection refused")


def test_an_error_whose_text_needs_the_gone_jvm_is_still_a_clean_stop(caplog):
    with caplog.at_level(logging.WARNING, logger="sketchboard"):
        assert _stopped_with_spark(_JavaErrorOfAGoneJvm()) == 0
    assert "_JavaErrorOfAGoneJvm" in caplog.text  # its type named, since its text cannot be read


def test_the_errors_first_line_is_said():
    assert _stopped_with_spark(RuntimeError("query stopped\nat ...")) == 0
