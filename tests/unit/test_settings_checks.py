"""Settings as an operator gives them (arguments, SKETCHBOARD_* variables, a settings file) and
the one-line errors `sketchboard` answers wrong ones with (exit 2, never a traceback)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sketchboard import cli
from sketchboard.settings import DEFAULT_ALERTS, Settings

OWN_STREAMS = """\
streams:
  orders:
    key_field: customer_id
    values: [amount]
metrics:
  order_amount: {stream: orders, value: amount}
"""
OWN_RULES = """\
rules:
  - name: big_orders
    kind: threshold
    metric: order_amount
    stat: max
    window: 1m
    op: ">"
    threshold: 1000
"""


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No SKETCHBOARD_* variable of the caller's and no ./sketchboard.yaml."""
    for name in [name for name in os.environ if name.upper().startswith("SKETCHBOARD_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def own_streams(tmp_path: Path) -> Path:
    folder = tmp_path / "own"
    folder.mkdir(exist_ok=True)
    path = folder / "streams.yaml"
    path.write_text(OWN_STREAMS)
    return path


def test_alert_rules_default_to_the_file_beside_the_streams_file(tmp_path, capsys):
    streams = own_streams(tmp_path)
    # No alerts.yaml beside a user's own streams file: no file rules (not the demo's, which name
    # the demo's metrics and stopped check-config and the API).
    assert cli.main(["check-config", "--config", str(streams), "--data-dir", str(tmp_path / "data")]) == 0
    assert "alert rules" not in capsys.readouterr().out
    from sketchboard.wiring import build_alert_service, open_catalog, open_store

    settings = Settings(data_dir=tmp_path / "data", streams_config=streams)
    assert settings.alerts_config == streams.parent / "alerts.yaml" and not settings.alerts_config_named
    store = open_store(settings)
    try:
        assert build_alert_service(settings, open_catalog(settings), store).rules() == []
        (streams.parent / "alerts.yaml").write_text(OWN_RULES)
        assert [r.stored.name for r in build_alert_service(settings, open_catalog(settings), store).rules()] == ["big_orders"]
    finally:
        store.close()
    assert cli.main(["check-config", "--config", str(streams)]) == 0
    assert f"{streams.parent / 'alerts.yaml'}: 1 alert rules - OK" in capsys.readouterr().out
    # The demo's streams file keeps the demo's rules.
    assert Settings().alerts_config == DEFAULT_ALERTS


@pytest.mark.parametrize("kind", ["missing", "folder"])
def test_a_named_alerts_file_that_is_not_there_stops_check_config_as_it_stops_the_api(kind, tmp_path, monkeypatch,
                                                                                        capsys):
    streams = own_streams(tmp_path)
    named = tmp_path / "rules.yaml"
    if kind == "folder":
        named.mkdir()
    monkeypatch.setenv("SKETCHBOARD_ALERTS_CONFIG", str(named))
    assert cli.main(["check-config", "--config", str(streams), "--data-dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    reason = "no such file" if kind == "missing" else "not a file"
    assert err == f"sketchboard: alerts_config: {named}: {reason}\n"
    from catalog import ConfigError
    from sketchboard.wiring import build_alert_service, open_catalog, open_store

    settings = Settings(data_dir=tmp_path / "data", streams_config=streams)
    store = open_store(settings)
    try:
        with pytest.raises(ConfigError, match=reason):
            build_alert_service(settings, open_catalog(settings), store)
    finally:
        store.close()


def test_an_os_error_is_one_line(monkeypatch, capsys):
    def unreadable(args):
        raise PermissionError(13, "Permission denied", "/etc/sketchboard/rules.yaml")

    monkeypatch.setattr(cli, "cmd_check_config", unreadable)
    assert cli.main(["check-config"]) == 2
    assert capsys.readouterr().err == "sketchboard: /etc/sketchboard/rules.yaml: Permission denied\n"


def test_a_jvm_gone_is_said_so_not_taken_for_a_path(monkeypatch, capsys):
    """py4j's socket to a JVM that went away (killed, out of memory) raises ConnectionRefusedError:
    it was printed as a file error, `sketchboard: [Errno 111] Connection refused`, exit 2."""
    import socket

    from py4j.clientserver import ClientServer, JavaParameters, PythonParameters

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    bridge = ClientServer(java_parameters=JavaParameters(port=port), python_parameters=PythonParameters(port=0))

    def pipeline(args):
        bridge.jvm.System.currentTimeMillis()  # no JVM listens there

    monkeypatch.setattr(cli, "cmd_check_config", pipeline)
    try:
        assert cli.main(["check-config"]) == 1
    finally:
        bridge.shutdown()
    assert capsys.readouterr().err == ("sketchboard: Spark's JVM went away ([Errno 111] Connection refused); its own"
                                       " lines above say why\n")


def test_an_empty_path_variable_means_none_or_is_refused(tmp_path, monkeypatch, capsys):
    for name in ("ALERTS_CONFIG", "DASHBOARDS_CONFIG", "TOKENS_FILE"):
        monkeypatch.setenv(f"SKETCHBOARD_{name}", "")
    settings = Settings()
    assert settings.alerts_config is None and settings.alerts_config_named  # no rules file, not Path(".")
    assert settings.dashboards_config is None and settings.tokens_file is None
    assert settings.tokens_path == Path("data") / "tokens.json"
    for name in ("DATA_DIR", "STREAMS_CONFIG"):
        monkeypatch.setenv(f"SKETCHBOARD_{name}", "")
        with pytest.raises(ValueError, match="must not be empty"):
            Settings()
        monkeypatch.delenv(f"SKETCHBOARD_{name}")
    with pytest.raises(SystemExit):
        cli.main(["check-config", "--data-dir", ""])
    assert "--data-dir: must not be empty" in capsys.readouterr().err


@pytest.mark.parametrize(("content", "problem"), [
    (b"port: [\n", "line 2: invalid YAML: expected the node content, but found '<stream end>'"),
    (b"- port\n", "line 1: the top level must be a mapping of settings (name: value), not a list"),
    (b"port: 9000\nhost: caf\xe9\n", "line 2: not UTF-8 text: byte 0xe9 cannot be decoded (save the file as UTF-8)"),
    (b"port: 9000\nport: 9001\n", "line 2: duplicate key 'port'"),
    (b"port: 9000\n1: 2\n", "line 2: 1 is no setting's name (names are text, e.g. port)"),
])
def test_a_settings_file_that_cannot_be_read_is_one_line(content, problem, tmp_path, monkeypatch, capsys):
    path, said = check_config_refuses(content, tmp_path, monkeypatch, capsys)
    assert said == f"sketchboard: {path}: {problem}\n"


def check_config_refuses(content: bytes, tmp_path, monkeypatch, capsys) -> tuple[Path, str]:
    """`check-config` with `content` as the settings file: exit 2; the file and what was said."""
    path = tmp_path / "settings.yaml"
    path.write_bytes(content)
    monkeypatch.setenv("SKETCHBOARD_SETTINGS_FILE", str(path))
    assert cli.main(["check-config"]) == 2
    return path, capsys.readouterr().err


def test_an_empty_settings_file_is_no_settings(tmp_path, monkeypatch):
    path = tmp_path / "settings.yaml"
    path.write_text("# nothing yet\n")
    monkeypatch.setenv("SKETCHBOARD_SETTINGS_FILE", str(path))
    assert Settings().port == 8000


def test_a_list_variable_that_is_not_json_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("SKETCHBOARD_TOKENS", "[{")
    assert cli.main(["check-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sketchboard: setting tokens (SKETCHBOARD_TOKENS): not valid JSON") and err.count("\n") == 1


def test_each_invalid_setting_is_one_line_naming_where_it_came_from(tmp_path, monkeypatch, capsys):
    path = tmp_path / "settings.yaml"
    path.write_text("host: 127.0.0.1\nmax_body_bytes: 10\n")
    monkeypatch.setenv("SKETCHBOARD_SETTINGS_FILE", str(path))
    monkeypatch.setenv("SKETCHBOARD_PORT", "0")
    monkeypatch.setenv("SKETCHBOARD_POSTGRES_DSN", "postgresql://me:secret@db/sb")
    monkeypatch.setenv("SKETCHBOARD_STORE_BACKEND", "mysql")
    assert cli.main(["check-config"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "sketchboard: setting port (SKETCHBOARD_PORT=0): Input should be greater than or equal to 1",
        f"sketchboard: setting max_body_bytes ({path}, line 2): Input should be greater than or equal to 1024",
        "sketchboard: setting store_backend (SKETCHBOARD_STORE_BACKEND=mysql): Input should be 'sqlite' or 'postgres'",
    ]
    monkeypatch.delenv("SKETCHBOARD_STORE_BACKEND")
    path.write_text("store_backend: postgres\n")
    monkeypatch.delenv("SKETCHBOARD_POSTGRES_DSN")
    assert cli.main(["check-config", "--port", "0"]) == 2  # the option wins over the variable, and is named
    assert capsys.readouterr().err.splitlines() == [
        "sketchboard: setting port (--port 0): Input should be greater than or equal to 1"]
    assert cli.main(["check-config"]) == 2 and capsys.readouterr().err.splitlines() == [
        "sketchboard: setting port (SKETCHBOARD_PORT=0): Input should be greater than or equal to 1"]
    monkeypatch.delenv("SKETCHBOARD_PORT")
    assert cli.main(["check-config"]) == 2
    assert capsys.readouterr().err.startswith("sketchboard: settings: store_backend is postgres: set postgres_dsn")


def test_a_misspelt_variable_is_refused_naming_the_closest_setting(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("SKETCHBOARD_DATADIR", str(tmp_path))
    with pytest.raises(ValueError, match=r"SKETCHBOARD_DATADIR: no such setting \(did you mean SKETCHBOARD_DATA_DIR\?\)"):
        Settings()
    assert cli.main(["check-config"]) == 2
    assert capsys.readouterr().err == ("sketchboard: SKETCHBOARD_DATADIR: no such setting"
                                       " (did you mean SKETCHBOARD_DATA_DIR?)\n")
    monkeypatch.delenv("SKETCHBOARD_DATADIR")
    # The variables read elsewhere are not settings, and are no error.
    for name in ("SKETCHBOARD_PARENT_PID", "SKETCHBOARD_SOAK_SECONDS", "SKETCHBOARD_FUZZ_EXAMPLES",
                 "SKETCHBOARD_CHROMIUM", "SKETCHBOARD_PORT_1", "SKETCHBOARD_PORT_2"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("sketchboard_port", "9001")  # names are not case-sensitive, as pydantic-settings reads them
    assert Settings().port == 9001
    monkeypatch.delenv("SKETCHBOARD_PARENT_PID")  # cli.main would take the test's process for a child of `up`
    path, said = check_config_refuses(b"prot: 9000\n", tmp_path, monkeypatch, capsys)
    assert said == f"sketchboard: setting prot ({path}, line 1): no such setting (did you mean port?)\n"


def test_a_duration_variable_may_be_a_number_of_seconds_as_in_the_file(tmp_path, monkeypatch):
    path = tmp_path / "settings.yaml"
    path.write_text("reprocess_drop_after: 0\nlag_retention: 3600\n")
    monkeypatch.setenv("SKETCHBOARD_SETTINGS_FILE", str(path))
    assert Settings().reprocess_drop_after == 0 and Settings().lag_retention == 3_600_000
    monkeypatch.setenv("SKETCHBOARD_REPROCESS_DROP_AFTER", "0")  # the documented default: never
    monkeypatch.setenv("SKETCHBOARD_LAG_RETENTION", "7200")
    monkeypatch.setenv("SKETCHBOARD_ALERT_WEBHOOK_BACKOFF", "0.25")
    settings = Settings()
    assert (settings.reprocess_drop_after, settings.lag_retention, settings.alert_webhook_backoff) == (0, 7_200_000, 250)
    monkeypatch.setenv("SKETCHBOARD_LAG_RETENTION", "-5")
    with pytest.raises(ValueError, match="not a duration"):
        Settings()
    # The streams file keeps refusing a duration as text without a unit.
    from catalog.loader import ConfigError, parse_catalog

    with pytest.raises(ConfigError, match="not a duration: '60'"):
        parse_catalog("streams:\n  s: {key_field: k, pane: '60'}\n")


@pytest.mark.parametrize("value", ["0s", "0", "59s"])
def test_log_retention_is_at_least_a_minute(value, monkeypatch, capsys):
    monkeypatch.setenv("SKETCHBOARD_LOG_RETENTION", value)
    with pytest.raises(ValueError, match="log_retention"):
        Settings()
    assert cli.main(["check-config"]) == 2
    assert capsys.readouterr().err.startswith(f"sketchboard: setting log_retention (SKETCHBOARD_LOG_RETENTION={value}):"
                                              " must be at least 1m (one minute)")
    monkeypatch.setenv("SKETCHBOARD_LOG_RETENTION", "1m")
    assert Settings().log_retention == 60_000


def test_token_create_leaves_the_tokens_file_as_it_was_when_the_audit_log_fails(tmp_path, monkeypatch, capsys):
    tokens = tmp_path / "tokens.json"
    monkeypatch.setenv("SKETCHBOARD_TOKENS_FILE", str(tokens))
    not_a_folder = tmp_path / "afile"
    not_a_folder.write_text("")
    # The data dir (where the audit log lives) cannot be used: one line, and no token written that
    # was never shown and that a retry would find there already.
    assert cli.main(["token", "create", "ci", "--scope", "read", "--data-dir", str(not_a_folder)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(f"sketchboard: {not_a_folder}"), err
    assert not tokens.exists()
    data = tmp_path / "data"
    assert cli.main(["token", "create", "ci", "--scope", "read", "--data-dir", str(data)]) == 0
    assert capsys.readouterr().out.strip()
    before = tokens.read_bytes()

    from store.audit import AuditStore

    def full_disk(self, *args, **kwargs):
        raise OSError(28, "No space left on device", str(data / "store.db"))

    monkeypatch.setattr(AuditStore, "record", full_disk)
    # The entry cannot be written once the file has changed: the change is undone.
    assert cli.main(["token", "create", "ci2", "--scope", "read", "--data-dir", str(data)]) == 2
    assert capsys.readouterr().err == f"sketchboard: {data / 'store.db'}: No space left on device\n"
    assert tokens.read_bytes() == before
    assert cli.main(["token", "revoke", "ci", "--data-dir", str(data)]) == 2
    assert tokens.read_bytes() == before
    tokens.unlink()
    assert cli.main(["token", "create", "ci", "--scope", "read", "--data-dir", str(data)]) == 2
    assert not tokens.exists()  # not an empty file, which would lock the API


@pytest.mark.parametrize("name", ["ws_heartbeat_interval", "ws_message_rate", "rate_limit_requests", "rate_limit_events",
                                  "demo_delay_mean", "demo_rate"])
@pytest.mark.parametrize("value", ["inf", "nan"])
def test_a_float_setting_is_finite(name, value, monkeypatch):
    monkeypatch.setenv(f"SKETCHBOARD_{name.upper()}", value)
    with pytest.raises(ValueError, match="finite number"):
        Settings()


def test_blank_servers_dsn_or_replica_id_are_refused(monkeypatch):
    for name, value in (("KAFKA_BOOTSTRAP_SERVERS", " "), ("POSTGRES_DSN", "  "), ("REPLICA_ID", ""),
                        ("REPLICA_ID", " ")):
        monkeypatch.setenv(f"SKETCHBOARD_{name}", value)
        with pytest.raises(ValueError, match=name.lower()):
            Settings()
        monkeypatch.delenv(f"SKETCHBOARD_{name}")
    monkeypatch.setenv("SKETCHBOARD_POSTGRES_DSN", "")  # empty: none
    assert Settings().postgres_dsn is None
    monkeypatch.setenv("SKETCHBOARD_STORE_BACKEND", "postgres")
    with pytest.raises(ValueError, match="store_backend is postgres: set postgres_dsn"):
        Settings()


def test_a_kafka_group_template_with_an_unknown_placeholder_is_refused(monkeypatch):
    """`{pipline}` was kept as written: every pipeline would have shared one consumer group."""
    monkeypatch.setenv("SKETCHBOARD_KAFKA_GROUP_ID", "sb-{pipline}")
    with pytest.raises(ValueError, match=r"unknown placeholder \{pipline\}"):
        Settings()
    for fine in ("sb-{pipeline}", "one-group"):
        monkeypatch.setenv("SKETCHBOARD_KAFKA_GROUP_ID", fine)
        assert Settings().kafka_group_id == fine


@pytest.mark.parametrize("name, value, problem", [
    ("SPARK_MASTER", "locall[2]", "no Spark master URL"),
    ("SPARK_MASTER", "local[0]", "at least one thread"),
    ("SPARK_MASTER", "spark:/master:7077", "no Spark master URL"),
    # Spark needs each standalone master as host:port, and reads the URL case-sensitively.
    ("SPARK_MASTER", "spark://127.0.0.1", "each master of spark:// is host:port"),
    ("SPARK_MASTER", "spark://a:7077,b", "'b' is no master address"),
    ("SPARK_MASTER", "spark://master:7077/", "host:port"),
    ("SPARK_MASTER", "spark://spark_master:7077", "'_' is no host to Spark"),
    ("SPARK_MASTER", "SPARK://master:7077", "case-sensitively: write 'spark://master:7077'"),
    ("SPARK_MASTER", "LOCAL[2]", "case-sensitively: write 'local\\[2\\]'"),
    ("SPARK_MASTER", "k8s://", "API server's address"),
    ("SPARK_DRIVER_MEMORY", "lots", "no JVM memory size"),
    ("SPARK_DRIVER_MEMORY", "2 g", "no JVM memory size"),
    # Spark refuses a heap under 450 MiB when its session starts (INVALID_DRIVER_MEMORY, INVALID_EXECUTOR_MEMORY).
    ("SPARK_DRIVER_MEMORY", "449m", "at least 450m"),
    ("SPARK_DRIVER_MEMORY", "1024", "at least 450m"),
    ("SPARK_CONF", '{"spark.executor.memory": "300m"}', "spark.executor.memory: '300m' is less than Spark runs with"),
    ("SPARK_CONF", '{"spark.driver.memory": "lots"}', "spark.driver.memory: 'lots' is no JVM memory size"),
    ("ALERT_WEBHOOK_URL", "not a url", "http:// or https:// URL"),
    ("HOST", " ", "must not be empty"),
])
def test_values_spark_or_a_socket_would_refuse_later_are_refused_at_start(name, value, problem, monkeypatch):
    """Each was accepted, then failed when Spark's session started (Could not parse Master URL, a
    JVM that does not start), at the first webhook, or bound an address nobody meant."""
    monkeypatch.setenv(f"SKETCHBOARD_{name}", value)
    with pytest.raises(ValueError, match=problem):
        Settings()


@pytest.mark.parametrize("url", ["http://alice:s3cret@", "http://:s3cret@", "http://h\x7f/", "https://exa mple.com/",
                                 "http://127.0.0.1:99999/", "ftp://h/", "http:///x", " http://hook/", "HTTP://hook/",
                                 "https://hook.example:8443/path?token=s3cret"])
def test_the_settings_accept_exactly_the_webhook_urls_the_notifier_takes(url, monkeypatch, capsys):
    """A URL the settings accepted but the notifier refused stopped the API at start with a
    traceback that printed it, password included. Now both say the same, neither shows the URL,
    and `check-config` refuses it as the API would; a stray blank around it is no part of it."""
    from alerts.webhook import WebhookNotifier

    try:
        WebhookNotifier(url.strip()).close(0.1)
        takes = True
    except ValueError as exc:
        assert "s3cret" not in str(exc)
        takes = False
    monkeypatch.setenv("SKETCHBOARD_ALERT_WEBHOOK_URL", url)
    if takes:
        assert Settings().alert_webhook_url == url.strip()
        return
    assert cli.main(["check-config"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sketchboard: setting alert_webhook_url (SKETCHBOARD_ALERT_WEBHOOK_URL): ")
    assert "s3cret" not in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[4, 2]", "local-cluster[2, 1, 1024]",
                                    "spark://spark-master:7077", "spark://a:7077,b:7077", "spark://10.0.0.5:7077",
                                    "spark://[::1]:7077", "yarn", "k8s://https://k:6443", "k8s://k:6443"])
def test_every_master_url_spark_takes_is_accepted(master, monkeypatch):
    monkeypatch.setenv("SKETCHBOARD_SPARK_MASTER", master)
    monkeypatch.setenv("SKETCHBOARD_LOG_BACKEND", "kafka")
    monkeypatch.setenv("SKETCHBOARD_KAFKA_BOOTSTRAP_SERVERS", "localhost:9092")
    assert Settings().spark_master == master


def test_the_idempotency_takeover_must_outlast_an_append(monkeypatch, tmp_path):
    """A retry taking over a first try still waiting on the brokers appended the request twice."""
    from sketchboard.wiring import open_idempotency_store
    from store import SqlitePaneStore

    monkeypatch.setenv("SKETCHBOARD_KAFKA_PRODUCE_TIMEOUT", "2m")
    with pytest.raises(ValueError, match="idempotency_in_flight_timeout .* must exceed kafka_produce_timeout"):
        Settings()
    monkeypatch.setenv("SKETCHBOARD_IDEMPOTENCY_IN_FLIGHT_TIMEOUT", "3m")
    settings = Settings()
    store = SqlitePaneStore(tmp_path / "store.db")
    keys = open_idempotency_store(settings, store)
    assert keys.in_flight_timeout_ms == 180_000  # the setting reaches the store
    assert keys.store_clock  # claims judged on the store's clock, whatever each replica's says
    keys.close()
    store.close()


def test_python_m_sketchboard_is_the_command(tmp_path):
    import subprocess
    import sys

    root = Path(cli.__file__).resolve().parents[1]
    env = {**{k: v for k, v in os.environ.items() if not k.upper().startswith("SKETCHBOARD_")},
           "PYTHONPATH": str(root)}
    done = subprocess.run([sys.executable, "-m", "sketchboard", "check-config", "--config", str(own_streams(tmp_path))],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{tmp_path / 'own' / 'streams.yaml'}: 1 streams, 1 metrics - OK")


def test_the_documented_check_config_output_is_the_commands(capsys, monkeypatch):
    root = Path(cli.__file__).resolve().parents[1]
    text = (root / "docs" / "configuration.md").read_text()
    command = "sketchboard check-config --config config/streams.yaml\n"
    block = text[text.index(command) + len(command):]
    shown = [line[2:] for line in block[:block.index("```")].splitlines() if not line.startswith("#   ...")]
    monkeypatch.chdir(root)
    assert cli.main(["check-config", "--config", "config/streams.yaml"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line for line in shown if line not in printed] == []


def test_check_config_fails_on_a_partition_shrink_and_notes_changed_definitions_of_the_data_there(tmp_path, capsys):
    """A configuration that parses but that the API and the pipeline refuse with the data there (fewer
    partitions than the log has) fails the check; a stream the pipeline will keep computing as stored
    is said. Nothing is created where there is no data yet."""
    import yaml

    from sketchboard.definitions import pin_definitions
    from sketchboard.wiring import open_catalog, open_log, open_store

    streams = tmp_path / "streams.yaml"
    old = {"streams": {"http": {"key_field": "user", "dimensions": ["endpoint"], "partitions": 4},
                       "orders": {"key_field": "customer", "values": ["amount"]}}}
    streams.write_text(yaml.safe_dump(old))
    data = tmp_path / "data"
    args = ["check-config", "--config", str(streams), "--data-dir", str(data)]
    assert cli.main(args) == 0 and not data.exists()  # no data: nothing to compare, nothing made
    capsys.readouterr()
    settings = Settings(data_dir=data, streams_config=streams)
    catalog = open_catalog(settings)
    open_log(settings, catalog).close()
    store = open_store(settings)
    pin_definitions(store, catalog, "main")
    store.close()
    assert cli.main(args) == 0
    assert "note:" not in capsys.readouterr().out

    new = {"streams": {**old["streams"], "http": {**old["streams"]["http"], "partitions": 2,
                                                  "dimensions": ["endpoint", "region"]}}}
    streams.write_text(yaml.safe_dump(new))
    assert cli.main(args) == 1
    out, err = capsys.readouterr()
    assert "error: stream 'http': partitions 2 but the log has 4" in err and "orders" not in err
    assert "note: stream 'http': definition changed" in out and "sketchboard reprocess http" in out
    assert "'orders'" not in out


def test_check_config_notes_changed_definitions_in_the_configured_store(store_backend, tmp_path, capsys, monkeypatch):
    """The definitions stored with the served output are read from the configured store, SQLite or
    PostgreSQL (a PostgreSQL store was not opened: a changed definition went unsaid); a PostgreSQL
    server out of reach is a note saying what was not checked, not a failed check."""
    import yaml

    from sketchboard.definitions import pin_definitions
    from sketchboard.wiring import open_catalog, open_store
    from tests.procs import free_port

    streams = tmp_path / "streams.yaml"
    old = {"streams": {"http": {"key_field": "user", "dimensions": ["endpoint"]},
                       "orders": {"key_field": "customer", "values": ["amount"]}}}
    streams.write_text(yaml.safe_dump(old))
    args = ["check-config", "--config", str(streams), "--data-dir", str(tmp_path / "data")]
    if store_backend.kind == "postgres":
        store = store_backend.create()
        monkeypatch.setenv("SKETCHBOARD_STORE_BACKEND", "postgres")
        monkeypatch.setenv("SKETCHBOARD_POSTGRES_DSN", store.dsn)
    else:
        store = open_store(Settings(data_dir=tmp_path / "data", streams_config=streams))
    assert cli.main(args) == 0 and "note:" not in capsys.readouterr().out  # nothing stored yet
    pin_definitions(store, open_catalog(Settings(data_dir=tmp_path / "data", streams_config=streams)), "main")
    store.close()
    assert cli.main(args) == 0 and "note:" not in capsys.readouterr().out

    streams.write_text(yaml.safe_dump({"streams": {**old["streams"], "http": {**old["streams"]["http"],
                                                                             "dimensions": ["endpoint", "region"]}}}))
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "note: stream 'http': definition changed" in out and "sketchboard reprocess http" in out
    assert "'orders'" not in out

    if store_backend.kind == "postgres":
        monkeypatch.setenv("SKETCHBOARD_POSTGRES_DSN", f"postgresql://nobody@127.0.0.1:{free_port()}/none")
        assert cli.main(args) == 0
        assert "note: the stored stream definitions were not checked: PostgreSQL:" in capsys.readouterr().out


@pytest.mark.kafka
def test_check_config_judges_the_kafka_topics_as_the_api_would_and_creates_none(kafka_broker, tmp_path, capsys,
                                                                              monkeypatch):
    """On a Kafka log the topics are judged as the API and the pipeline judge them when they start
    (a partition count that shrank, or one the topic lacks, stops them: an error), listed, never
    made; a broker out of reach is a note (the embedded log's check alone ran before)."""
    import uuid

    import yaml
    from confluent_kafka.admin import AdminClient

    from ingest.log.kafka import KafkaEventLog
    from sketchboard.wiring import open_catalog
    from tests.kafka_broker import client_config
    from tests.procs import free_port

    prefix = f"checkcfg-{uuid.uuid4().hex[:8]}."
    streams = tmp_path / "streams.yaml"
    old = {"streams": {"http": {"key_field": "user", "partitions": 4},
                       "orders": {"key_field": "customer", "values": ["amount"]}}}
    streams.write_text(yaml.safe_dump(old))
    monkeypatch.setenv("SKETCHBOARD_LOG_BACKEND", "kafka")
    monkeypatch.setenv("SKETCHBOARD_KAFKA_BOOTSTRAP_SERVERS", kafka_broker.bootstrap)
    monkeypatch.setenv("SKETCHBOARD_KAFKA_TOPIC_PREFIX", prefix)
    monkeypatch.setenv("SKETCHBOARD_KAFKA_REPLICATION_FACTOR", "1")
    args = ["check-config", "--config", str(streams), "--data-dir", str(tmp_path / "data")]
    log = KafkaEventLog(kafka_broker.bootstrap, topic_prefix=prefix, replication_factor=1)
    log.ensure_topic(open_catalog(Settings(data_dir=tmp_path / "data", streams_config=streams)).streams["http"])
    log.close()  # the http topic only
    assert cli.main(args) == 0
    capsys.readouterr()

    streams.write_text(yaml.safe_dump({"streams": {**old["streams"], "http": {**old["streams"]["http"], "partitions": 2}}}))
    assert cli.main(args) == 1
    err = capsys.readouterr().err
    assert f"error: Kafka topic '{prefix}http' has 4 partitions, more than the 2 configured" in err
    topics = AdminClient(client_config(kafka_broker.bootstrap)).list_topics(timeout=10).topics
    assert f"{prefix}http" in topics and f"{prefix}orders" not in topics  # judged, none made

    monkeypatch.setenv("SKETCHBOARD_KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("SKETCHBOARD_KAFKA_REQUEST_TIMEOUT", "2s")
    assert cli.main(args) == 0
    assert "note: the Kafka topics were not checked:" in capsys.readouterr().out
