"""Real processes for end-to-end tests: the API and the pipeline as separate `sketchboard`
processes on a free loopback port, with a settings file under tmp_path; the pipeline can be
stopped (SIGTERM) and started again while the API keeps serving. Shared by tests/e2e and
tests/browser: the `service_factory` fixture is in tests/conftest.py, a browser test points
its page at `service.base`."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import yaml


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            return "zombie" not in status.read()
    except FileNotFoundError:
        return False


def stop_group(proc: subprocess.Popen, timeout_s: float = 60) -> None:
    """Stop a `sketchboard up` started in a session of its own: SIGTERM to its process group
    (up stops its children itself), SIGKILL to the group if it is still there after `timeout_s`."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def service_environment() -> dict[str, str]:
    """This environment for a real `sketchboard` process, less the suite's own
    SKETCHBOARD_INGEST_PROCESSES (tests/conftest.py): a real service runs with the default, ingest
    worker processes on the embedded log, as `make run` does."""
    return {k: v for k, v in os.environ.items() if k != "SKETCHBOARD_INGEST_PROCESSES"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    def __init__(self, root: Path, settings: dict):
        self.root = root
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.settings_file = root / "sketchboard.yaml"
        # A demo shop of 2 000 users unless a test says otherwise: the users table the demo loads
        # first is then 2 000 rows for the pipeline to catch up on, not 50 000 (a minute of a test).
        self.settings_file.write_text(yaml.safe_dump(
            {"data_dir": str(root / "data"), "host": "127.0.0.1", "port": self.port, "demo_users": 2_000, **settings}))
        self.env = {**service_environment(), "PYTHONUNBUFFERED": "1",
                    "SKETCHBOARD_SETTINGS_FILE": str(self.settings_file)}
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, object] = {}
        self.http = httpx.Client(base_url=self.base, timeout=10)

    def _spawn(self, name: str) -> subprocess.Popen:
        log = self._logs.get(name) or open(self.root / f"{name}.log", "a")
        self._logs[name] = log
        proc = subprocess.Popen([sys.executable, "-m", "sketchboard.cli", name], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def log_tail(self, name: str, chars: int = 3000) -> str:
        path = self.root / f"{name}.log"
        return path.read_text()[-chars:] if path.exists() else ""

    def start_api(self, timeout_s: float = 60) -> None:
        proc = self._spawn("api")
        self.wait_for(lambda: self._healthy(proc), timeout_s, "the API to answer /healthz")

    def _healthy(self, proc) -> bool:
        assert proc.poll() is None, self.log_tail("api")
        try:
            return self.http.get("/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_pipeline(self) -> subprocess.Popen:
        return self._spawn("pipeline")

    def stop(self, name: str, timeout_s: float = 60) -> int | None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return None if proc is None else proc.returncode
        # SIGTERM to the process only, as `sketchboard up` does: signalling the whole group would
        # also kill the pipeline's JVM before the Python side could stop its query cleanly.
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # Where it hangs, for the failing test's output: its threads' stacks (sketchboard/cli.py
            # registers SIGUSR1 with faulthandler) and the end of its log.
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            os.killpg(proc.pid, signal.SIGKILL)
            print(f"{name} did not stop within {timeout_s} s of SIGTERM; its log's end, with its threads' stacks:\n"
                  f"{self.log_tail(name, 30_000)}", file=sys.stderr)
            return proc.wait()

    def get(self, path: str, **params) -> dict:
        r = self.http.get(path, params=params)
        r.raise_for_status()
        return r.json()

    def wait_for(self, predicate: Callable[[], object], timeout_s: float, what: str, every_s: float = 0.25):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            for name, proc in self.procs.items():
                assert proc.poll() is None, f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}"
            time.sleep(every_s)
        raise AssertionError(f"timed out after {timeout_s} s waiting for {what}\n"
                             f"--- pipeline log ---\n{self.log_tail('pipeline')}\n--- api log ---\n{self.log_tail('api')}")

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)
        self.http.close()
        for log in self._logs.values():
            log.close()


class Producer:
    """Posts `per_post` events to a stream every `every_s` seconds from a thread, with the
    current time as event time, until stopped."""

    def __init__(self, base: str, stream: str = "orders", per_post: int = 20, every_s: float = 0.2):
        self.base, self.stream, self.per_post, self.every_s = base, stream, per_post, every_s
        self.sent = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def start(self) -> Producer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=10) as client:
            while not self._stop.is_set():
                now = int(time.time() * 1000)
                events = [{"time": now, "customer_id": f"c{(self.sent + i) % 50}", "amount": 10.0}
                          for i in range(self.per_post)]
                try:
                    r = client.post("/api/v1/events", params={"stream": self.stream}, json=events)
                    if r.status_code == 200:
                        self.sent += r.json()["accepted"]
                    else:
                        self.errors.append(r.text)
                except httpx.HTTPError as exc:
                    self.errors.append(str(exc))
                self._stop.wait(self.every_s)
