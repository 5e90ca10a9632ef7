"""`log_backend: kafka` end to end through the settings and the wiring: `build_api` opens the
Kafka log (topics created at start), POST /api/v1/events answers once the real broker
acknowledged the events, and 503 with the reason while the broker is down."""

from __future__ import annotations

import time
import uuid
import warnings

import pytest
from pydantic import ValidationError

from sketchboard.settings import Settings

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


def test_kafka_backend_needs_bootstrap_servers(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    assert Settings().log_backend == "embedded"  # the laptop default stays
    with pytest.raises(ValidationError, match="set kafka_bootstrap_servers"):
        Settings(log_backend="kafka")


def test_kafka_settings_from_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SKETCHBOARD_LOG_BACKEND", "kafka")
    monkeypatch.setenv("SKETCHBOARD_KAFKA_BOOTSTRAP_SERVERS", "b1:9092,b2:9092")
    monkeypatch.setenv("SKETCHBOARD_KAFKA_OPTIONS", '{"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}')
    monkeypatch.setenv("SKETCHBOARD_KAFKA_PRODUCE_TIMEOUT", "3s")
    s = Settings()
    assert s.kafka_bootstrap_servers == "b1:9092,b2:9092"
    assert s.kafka_options == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN"}
    assert s.kafka_produce_timeout == 3000 and s.kafka_topic_prefix == "sketchboard." and s.kafka_replication_factor is None
    with pytest.raises(ValidationError, match="kafka_topic_prefix"):
        Settings(kafka_topic_prefix="bad prefix/")


@pytest.mark.kafka
def test_api_writes_to_kafka_and_answers_503_while_the_broker_is_down(kafka_broker, tmp_path, monkeypatch) -> None:
    from sketchboard.wiring import build_api

    monkeypatch.chdir(tmp_path)
    prefix = f"api-{uuid.uuid4().hex[:8]}."
    settings = Settings(data_dir=tmp_path / "data", log_backend="kafka", kafka_bootstrap_servers=kafka_broker.bootstrap,
                        kafka_topic_prefix=prefix, kafka_replication_factor=1, kafka_produce_timeout="2s", kafka_request_timeout="2s",
                        alerts_config=None)
    app, ctx = build_api(settings)
    assert type(ctx.log).__name__ == "KafkaEventLog"
    # Every stream's topic was created at start, with the stream's partition count.
    for name, stream in ctx.catalog.streams.items():
        assert len(ctx.log.offsets(name)) == stream.partitions
    now = int(time.time() * 1000)
    events = [{"time": now, "customer_id": f"c{i}", "amount": 10.0 + i} for i in range(20)]
    with TestClient(app, base_url="http://127.0.0.1") as client:  # a loopback Host (DNS-rebinding check)
        r = client.post("/api/v1/events", params={"stream": "orders"}, json=events + [{"time": now}])
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["accepted"] == 20 and len(body["rejected"]) == 1
        assert sum(count for _, count in body["partitions"].values()) == 20
        ends = {p: o.end for p, o in ctx.log.offsets("orders").items()}
        assert sum(ends.values()) == 20
        for p, (first, count) in body["partitions"].items():
            assert ends[int(p)] == first + count
        # Lag as the API samples it: end offsets from the broker, and the age of the oldest
        # unread record from its timestamp (nothing committed yet: the partition's first record).
        time.sleep(0.3)
        samples = {s.partition: s for s in ctx.lag.sampler.sample() if s.stream == "orders"}
        assert {p: s.log_end for p, s in samples.items()} == ends
        for s in samples.values():
            if s.log_end:
                assert s.committed is None and 250 <= s.lag_ms < 30_000, s
            else:
                assert s.lag_ms == 0

        kafka_broker.stop()
        try:
            r = client.post("/api/v1/events", params={"stream": "orders"}, json=events)
            assert r.status_code == 503, r.text
            assert "none is reported accepted" in r.json()["detail"]
            assert "did not acknowledge 20 of 20 records" in r.json()["detail"]
            r = client.get("/api/v1/streams")  # any route reading the log: 503 too, not a 500
            assert r.status_code == 503 and "the log is unavailable" in r.json()["detail"], r.text
            r = client.get("/readyz")
            assert r.status_code == 503 and r.json()["checks"]["log"].startswith("error: could not read"), r.text
        finally:
            kafka_broker.start()
        r = client.post("/api/v1/events", params={"stream": "orders"}, json=events)
        assert r.status_code == 200 and r.json()["accepted"] == 20
    assert sum(o.end for o in ctx.log.offsets("orders").values()) == 40  # the refused request wrote nothing
    ctx.log.close()


def test_pipeline_without_the_kafka_connector_exits_saying_how_to_get_it(monkeypatch, tmp_path, capsys) -> None:
    from sketchboard import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SKETCHBOARD_LOG_BACKEND", "kafka")
    monkeypatch.setenv("SKETCHBOARD_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    monkeypatch.setenv("SKETCHBOARD_SPARK_KAFKA_JARS", str(tmp_path / "no-jars"))
    assert cli.main(["pipeline", "--data-dir", str(tmp_path / "data")]) == 2
    assert "Spark's Kafka connector is not in" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["api", "pipeline"])
def test_an_unreachable_kafka_exits_saying_so(command, monkeypatch, tmp_path, capsys) -> None:
    from sketchboard import cli
    from tests.procs import free_port

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SKETCHBOARD_LOG_BACKEND", "kafka")
    monkeypatch.setenv("SKETCHBOARD_KAFKA_BOOTSTRAP_SERVERS", f"127.0.0.1:{free_port()}")  # nothing listens
    monkeypatch.setenv("SKETCHBOARD_KAFKA_REQUEST_TIMEOUT", "1s")
    began = time.monotonic()
    assert cli.main([command, "--data-dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert "could not read the metadata of Kafka topic 'sketchboard." in err and "127.0.0.1:" in err, err
    assert time.monotonic() - began < 10


@pytest.mark.kafka
def test_an_event_over_kafkas_record_limit_is_a_413_naming_it_and_nothing_is_written(kafka_broker, tmp_path,
                                                                                      monkeypatch) -> None:
    """An event the validator and the JSON limits accept (twenty 60 000-character strings) but
    whose record is over the producer's message.max.bytes can never be stored: the whole request
    is refused before anything is produced, with a 413 naming the event by its index in the
    request, not a 500 after the events before it were written (nor a 503 to retry for ever)."""
    from sketchboard.wiring import build_api

    monkeypatch.chdir(tmp_path)
    prefix = f"api-{uuid.uuid4().hex[:8]}."
    settings = Settings(data_dir=tmp_path / "data", log_backend="kafka", kafka_bootstrap_servers=kafka_broker.bootstrap,
                        kafka_topic_prefix=prefix, kafka_replication_factor=1, alerts_config=None)
    app, ctx = build_api(settings)
    now = int(time.time() * 1000)
    small = {"time": now, "customer_id": "c1", "amount": 1.0}
    huge = {**small, **{f"x{i}": "y" * 60_000 for i in range(20)}}
    with TestClient(app, base_url="http://127.0.0.1") as client:
        r = client.post("/api/v1/events", params={"stream": "orders"}, json=[small, {"time": now}, huge, small])
        assert r.status_code == 413, r.text
        detail = r.json()["detail"]
        assert "nothing was written" in detail["message"]
        ((rejected),) = detail["rejected"]
        assert rejected["index"] == 2 and "over the 1000000 bytes" in rejected["reason"], rejected
        assert sum(o.end for o in ctx.log.offsets("orders").values()) == 0
        r = client.post("/api/v1/events", params={"stream": "orders"}, json=[small])
        assert r.status_code == 200, r.text
