"""The composition root: the Java check (with fake `java` binaries; the real one is checked in
tests/spark/test_java.py), settings sources and the CLI's error handling."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sketchboard import cli
from sketchboard.javacheck import JavaError, check_java, parse_java_major
from sketchboard.settings import Settings


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_392"', 8),
        ("no version here", None),
    ],
)
def test_java_major_version_is_read_from_java_version_output(output, major):
    assert parse_java_major(output) == major


def fake_java(tmp_path: Path, version_line: str) -> Path:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return home


def test_old_java_fails_fast_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path, 'java version "1.8.0_392"')))
    with pytest.raises(JavaError, match="Java 8 found .* needs Java 17 or newer"):
        check_java()


def test_missing_java_fails_fast_with_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaError, match="Java not found"):
        check_java()


def test_pipeline_command_exits_2_with_the_java_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("JAVA_HOME", str(fake_java(tmp_path, 'openjdk version "11.0.2"')))
    assert cli.main(["pipeline", "--data-dir", str(tmp_path / "data")]) == 2
    assert "Java 11 found" in capsys.readouterr().err


def test_settings_defaults_bind_loopback_and_env_overrides(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert Settings().host == "127.0.0.1" and Settings().port == 8000
    monkeypatch.setenv("SKETCHBOARD_PORT", "9001")
    monkeypatch.setenv("SKETCHBOARD_LOG_RETENTION", "2d")
    settings = Settings()
    assert settings.port == 9001 and settings.log_retention == 2 * 86_400_000


def test_settings_file_is_read_and_env_wins(monkeypatch, tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text("port: 9100\nmax_body_bytes: 2048\n")
    monkeypatch.setenv("SKETCHBOARD_SETTINGS_FILE", str(path))
    assert Settings().max_body_bytes == 2048 and Settings().port == 9100
    monkeypatch.setenv("SKETCHBOARD_PORT", "9200")
    assert Settings().port == 9200


def test_unknown_setting_is_refused(monkeypatch, tmp_path):
    path = tmp_path / "settings.yaml"
    path.write_text("prot: 9100\n")
    monkeypatch.setenv("SKETCHBOARD_SETTINGS_FILE", str(path))
    assert cli.main(["check-config"]) == 2


def test_check_config_names_the_line_of_a_bad_config(tmp_path, capsys):
    bad = tmp_path / "streams.yaml"
    bad.write_text("streams:\n  s:\n    pane: 7x\n")
    assert cli.main(["check-config", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 3" in err and "not a duration" in err


def test_check_config_accepts_the_shipped_config(capsys):
    assert cli.main(["check-config"]) == 0
    assert "2 streams" in capsys.readouterr().out


def test_help_lists_every_part():
    text = cli.build_parser().format_help()
    for command in ("up", "api", "pipeline", "demo", "check-config"):
        assert command in text
    assert os.path.basename(cli.__file__) == "cli.py"


def test_store_backend_postgres_needs_a_dsn(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert Settings().store_backend == "sqlite"
    with pytest.raises(ValueError, match="store_backend is postgres: set postgres_dsn"):
        Settings(store_backend="postgres")


@pytest.mark.postgres
def test_open_store_opens_the_configured_backend(monkeypatch, tmp_path, postgres_server):
    from sketchboard.wiring import open_store
    from store import SqlitePaneStore
    from store.postgres import PostgresPaneStore

    monkeypatch.chdir(tmp_path)
    sqlite = open_store(Settings(data_dir=tmp_path / "data"))
    assert isinstance(sqlite, SqlitePaneStore) and sqlite.path == tmp_path / "data" / "store.db"
    sqlite.close()
    monkeypatch.setenv("SKETCHBOARD_STORE_BACKEND", "postgres")
    monkeypatch.setenv("SKETCHBOARD_POSTGRES_DSN", postgres_server.fresh_dsn())
    store = open_store(Settings())
    try:
        assert isinstance(store, PostgresPaneStore) and store.last_batch_id("main") is None
    finally:
        store.close()
