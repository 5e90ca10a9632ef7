"""The machine's own Java, as the pipeline's start-up check reads it (the JVM-free parts of the
check, with fake `java` binaries, are in tests/unit/test_composition.py)."""

from __future__ import annotations

import pytest

from sketchboard.javacheck import check_java

pytestmark = pytest.mark.spark  # runs the real `java -version`


def test_the_machines_java_is_good_enough():
    assert check_java() >= 17
