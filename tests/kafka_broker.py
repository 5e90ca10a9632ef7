"""A real Apache Kafka broker for the tests: KRaft, one node that is broker and controller, on
free loopback ports, its data in a temporary folder, from the jars `make jars` resolves into
jars/kafka-broker (jvm/kafka-broker/pom.xml). The `kafka_broker` fixture in tests/conftest.py
starts one per test session; `stop()` and `start()` let a test take it away and bring it back
on the same ports with the same data (a broker restart in the middle of a run)."""

from __future__ import annotations

import base64
import logging
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tests.procs import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
BROKER_JARS = REPO_ROOT / "jars" / "kafka-broker"
STAMP = BROKER_JARS / ".resolved"  # written by `make jars` after a complete fetch


class BrokerJarsMissing(RuntimeError):
    pass


def client_config(bootstrap: str, **options) -> dict:
    """confluent-kafka settings for a test's own client: librdkafka's log lines (connection
    refused while the broker is stopped, say) go to Python logging, not to the test's stderr."""
    return {"bootstrap.servers": bootstrap, "logger": logging.getLogger("tests.kafka"), **options}


def cluster_id() -> str:
    """What `kafka-storage random-uuid` prints (Kafka's Uuid: 16 random bytes, URL-safe base64
    without padding, never starting with '-'), without paying a JVM start for it."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def server_properties(data_dir: Path, port: int, controller_port: int) -> str:
    return "\n".join([
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.voters=1@127.0.0.1:{controller_port}",
        f"listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        f"advertised.listeners=PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        "inter.broker.listener.name=PLAINTEXT",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        f"log.dirs={data_dir}",
        # One node: every internal topic has one replica.
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=1",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=1",  # one coordinator load: the ready probe covers every id
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        # Topics exist because Sketchboard created them (or the test did), never by accident.
        "auto.create.topics.enable=false",
        "num.partitions=1",
        # The log cleaner looks for compacted topics to clean every 200 ms (tests/spark/test_tables.py).
        "log.cleaner.backoff.ms=200",
        "",
    ])


class KafkaBroker:
    def __init__(self, root: Path, *, heap: str = "768m"):
        if not STAMP.exists():
            raise BrokerJarsMissing(f"the Kafka broker's jars are not in {BROKER_JARS}: run `make jars`"
                                    " (needs Maven and Java 17+)")
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.heap = heap
        self.config = self.root / "server.properties"
        self.config.write_text(server_properties(self.root / "data", self.port, self.controller_port))
        self.log_path = self.root / "broker.log"
        self.proc: subprocess.Popen | None = None
        self.start_seconds: list[float] = []  # how long each start took until the broker answered
        self._java(["kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", str(self.config)], check=True)

    def _java(self, args: list[str], *, check: bool = False, **popen) -> subprocess.Popen | subprocess.CompletedProcess:
        cmd = ["java", f"-Xmx{self.heap}", "-cp", f"{BROKER_JARS}/*",
               # slf4j-simple: INFO and up to the broker's log file, with times.
               "-Dorg.slf4j.simpleLogger.showDateTime=true", *args]
        if check:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
            return done
        return subprocess.Popen(cmd, **popen)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 90) -> None:
        """Start the broker (same ports, same data) and wait until it serves metadata."""
        assert not self.running, "the broker is already running"
        began = time.monotonic()
        with open(self.log_path, "a") as log:
            self.proc = self._java(["kafka.Kafka", str(self.config)], stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        self._wait_ready(began + timeout_s)
        self.start_seconds.append(round(time.monotonic() - began, 1))

    def _wait_ready(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient(client_config(self.bootstrap))
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the Kafka broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                # Metadata naming our node means the broker is registered and unfenced.
                if admin.list_topics(timeout=1).brokers:
                    self._wait_transactions(deadline)
                    return
            except Exception:  # noqa: BLE001 - not up yet: any error means "ask again"
                pass
            time.sleep(0.2)
        self.stop(kill=True)
        raise RuntimeError(f"the Kafka broker did not answer within the timeout:\n{self.log_tail()}")

    def _wait_transactions(self, deadline: float) -> None:
        """A broker serves metadata before its transaction coordinator is ready (the first
        transactional producer makes its state topic; a restart loads it): a producer's first
        init_transactions then fails COORDINATOR_LOAD_IN_PROGRESS or NOT_COORDINATOR, under load
        for longer than a test's short timeouts. One throwaway producer's init waits for it (one
        partition of transaction state: its coordinator is every transactional id's)."""
        from confluent_kafka import Producer

        probe = Producer(client_config(self.bootstrap, **{"transactional.id": "tests-broker-ready-probe"}))
        probe.init_transactions(max(1.0, deadline - time.monotonic()))

    def stop(self, *, kill: bool = False, timeout_s: float = 60) -> None:
        """SIGTERM (a controlled shutdown) or SIGKILL (a crash); waits for the process to end."""
        if not self.running:
            return
        os.killpg(self.proc.pid, signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""
