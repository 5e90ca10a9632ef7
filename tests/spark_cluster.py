"""A real Spark standalone cluster for the tests and bench/scale_out.py: one master and N workers
started from the pyspark installation's own `spark-class` (no separate Spark download), all on
loopback (SPARK_LOCAL_IP=127.0.0.1), on free ports, their work folders and logs in a temporary
folder, stopped at the end (workers first, then the master; a process group each, so their
executor JVMs and Python workers go with them).

    with SparkCluster(root, workers=2) as cluster:
        settings = {"spark_master": cluster.master_url, ...}

Start-up costs ~6 s for the master and ~7 s more per worker on a quiet 2-core machine (JVMs):
the workers start in parallel, and `start()` returns when the master's JSON status page lists
every worker ALIVE, so a job submitted right after finds its executors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark

from tests.procs import free_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent  # pip's pyspark is a Spark distribution: bin/, jars/


class SparkCluster:
    def __init__(self, root: Path, *, workers: int = 1, cores: int = 1, memory: str = "1g",
                 daemon_memory: str = "256m"):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port, self.webui_port = free_port(), free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.workers, self.cores, self.memory = workers, cores, memory
        self.daemon_memory = daemon_memory  # heap of the master and worker daemons (not the executors)
        self.procs: list[subprocess.Popen] = []
        self._logs: list = []

    def _env(self) -> dict[str, str]:
        # Nothing of the test process's Python setup: a worker is another machine, whose executors
        # get their interpreter from the driver (PYSPARK_PYTHON) and nothing else.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_") and k != "PYTHONPATH"}
        env.update({
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOCAL_IP": "127.0.0.1",  # bind and advertise loopback, not the host's name
            "SPARK_DAEMON_MEMORY": self.daemon_memory,
            # The daemons' own settings; without a conf dir Spark would look in SPARK_HOME/conf.
            "SPARK_CONF_DIR": str(self.root / "conf"),
            "SPARK_LOG_DIR": str(self.root / "logs"),
        })
        return env

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.root / f"{name}.log", "ab")
        self._logs.append(log)
        proc = subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=self._env(), stdout=log,
                                stderr=subprocess.STDOUT, cwd=self.root, start_new_session=True)
        self.procs.append(proc)
        return proc

    def start(self, timeout_s: float = 180) -> SparkCluster:
        (self.root / "conf").mkdir(exist_ok=True)
        deadline = time.monotonic() + timeout_s
        try:
            master = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                                            "--port", str(self.port), "--webui-port", str(self.webui_port)])
            self._wait(lambda: self.status() is not None, deadline, "the master to answer", master)
            for i in range(self.workers):
                work = self.root / f"worker{i}"
                work.mkdir(exist_ok=True)
                self._spawn(f"worker{i}", [
                    "org.apache.spark.deploy.worker.Worker", self.master_url, "--host", "127.0.0.1",
                    "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", str(self.cores),
                    "--memory", self.memory, "--work-dir", str(work)])
            self._wait(lambda: self.alive_workers() == self.workers, deadline,
                       f"{self.workers} worker(s) to register with the master")
        except BaseException:
            self.stop()
            raise
        return self

    def status(self) -> dict | None:
        """The master's JSON status (its web UI's /json/), or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.webui_port}/json/", timeout=2) as answer:
                return json.load(answer)
        except (OSError, ValueError):
            return None

    def alive_workers(self) -> int:
        status = self.status() or {}
        return sum(1 for w in status.get("workers", []) if w.get("state") == "ALIVE")

    def _wait(self, ready, deadline: float, what: str, proc: subprocess.Popen | None = None) -> None:
        while time.monotonic() < deadline:
            for p in ([proc] if proc else self.procs):
                if p.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited with {p.returncode} while waiting for {what}:\n"
                                       f"{self.log_tail()}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        parts = []
        for log in sorted(self.root.glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def stop(self, timeout_s: float = 30) -> None:
        """Workers first (they kill their executors), then the master; SIGKILL past the timeout."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
