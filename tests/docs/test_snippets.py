"""Every code example in README.md and docs/*.md runs, so the documentation cannot rot.

Fenced blocks are found in the markdown and run by their language: `python` executed,
`sh`/`bash` run by bash against one live `sketchboard api` process (embedded defaults, a
temporary data folder, a free loopback port; no Spark pipeline), `yaml` parsed by the loader
that reads such a file (streams catalog, alert rules, settings), `json` parsed. A block that
cannot run here (`make run`, docker compose, a Spark pipeline, a long benchmark, a picture) is
marked by an HTML comment on the line before its fence, `<!-- no-run: why -->`, and every
block must be one or the other. The documents' relative links are checked too, and the
configuration document must name every setting."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from alerts.loader import load_rules_file
from catalog.loader import load_catalog, parse_catalog
from sketchboard.settings import DEFAULT_STREAMS, REPO_ROOT, Settings

DOCUMENTS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^`\n]*)$")
NO_RUN = re.compile(r"^\s*<!--\s*no-run:\s*\S.*-->\s*$")
RUNNERS = {"python": "python", "sh": "shell", "bash": "shell", "yaml": "yaml", "json": "json"}
# The examples address the service where `make run` serves it; the test's own API is elsewhere.
EXAMPLE_HOSTS = ("127.0.0.1:8000", "localhost:8000")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    info: str
    code: str
    marked_no_run: bool

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO_ROOT)}:{self.line}"

    @property
    def language(self) -> str:
        return self.info.split()[0] if self.info.split() else ""

    @property
    def needs_api(self) -> bool:
        return any(host in self.code for host in EXAMPLE_HOSTS)

    def against(self, host: str) -> str:
        """The code with the example's address replaced by the live API's."""
        code = self.code
        for example in EXAMPLE_HOSTS:
            code = code.replace(example, host)
        return code


def blocks_of(path: Path) -> list[Block]:
    lines = path.read_text().split("\n")
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent = opening.group("indent")
        end = i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        assert end < len(lines), f"{path.name}:{i + 1}: a fence that is never closed"
        # list items indent their blocks: drop the item's indentation from the code
        code = "\n".join(line[len(indent):] if line.startswith(indent) else line for line in lines[i + 1:end])
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        found.append(Block(path, i + 1, opening.group("info").strip(), code + "\n", bool(NO_RUN.match(before))))
        i = end + 1
    return found


ALL_BLOCKS = [block for path in DOCUMENTS for block in blocks_of(path)]
RUN = [block for block in ALL_BLOCKS if not block.marked_no_run]


def test_every_block_is_run_or_marked():
    unrunnable = [f"{block.id} (```{block.info})" for block in RUN if block.language not in RUNNERS]
    assert not unrunnable, ("blocks in a language this test cannot run and not marked <!-- no-run: why -->: "
                            + ", ".join(unrunnable))
    assert len(RUN) >= 8, "the examples were not found: has the markdown's fence syntax changed?"


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    """One real `sketchboard api` process on loopback over a fresh data folder: the demo's
    streams and alert rules, the embedded log and SQLite store, no tokens (open on loopback)."""
    from tests.procs import Service

    service = Service(tmp_path_factory.mktemp("docs-api"), {})
    try:
        service.start_api(timeout_s=120)
        yield service
    finally:
        service.close()


def run_python(block: Block, host: str | None) -> None:
    os.chdir(REPO_ROOT)  # examples name files as the repository does (config/streams.yaml)
    code = block.against(host) if host else block.code
    exec(compile(code, block.id, "exec"), {"__name__": "docs_example"})


def run_shell(block: Block, host: str, work: Path) -> None:
    script = block.against(host)
    # An example's curl that gets a 4xx or 5xx fails the block instead of printing the error.
    preamble = 'set -euo pipefail\ncurl() { command curl --fail-with-body --silent --show-error --max-time 30 "$@"; }\n'
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    # In a folder of its own (what `sketchboard token create` writes goes to its data/), with the
    # repository's config/ as the examples name it.
    (work / "config").symlink_to(REPO_ROOT / "config")
    done = subprocess.run(["bash", "-c", preamble + script], cwd=work, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, (f"{block.id} exited {done.returncode}\n--- script ---\n{script}"
                                  f"\n--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}")


def run_yaml(block: Block, tmp_path: Path) -> None:
    document = yaml.safe_load(block.code)
    assert isinstance(document, dict), f"{block.id}: not a YAML mapping"
    if "streams" in document:
        parse_catalog(block.code, source=block.id)
    elif "rules" in document:
        rules_file = tmp_path / "alerts.yaml"
        rules_file.write_text(block.code)
        load_rules_file(rules_file, load_catalog(DEFAULT_STREAMS))
    else:  # a sketchboard.yaml: the settings as the service would load them (unknown keys refused)
        Settings(**document)


def run_json(block: Block, tmp_path: Path) -> None:
    json.loads(block.code)


# Examples that talk to the live API start a real process: marked e2e like the other such tests
# (`make test-fast` runs the rest: Python, YAML, JSON and offline shell examples).
@pytest.mark.parametrize("block", [pytest.param(block, id=block.id, marks=[pytest.mark.e2e] if block.needs_api else [])
                                   for block in RUN])
def test_example_runs(block: Block, tmp_path, monkeypatch, request):
    # Settings read SKETCHBOARD_* and ./sketchboard.yaml: an example must not depend on the test's.
    for name in [name for name in os.environ if name.startswith("SKETCHBOARD_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    kind = RUNNERS[block.language]
    host = request.getfixturevalue("api").base.removeprefix("http://") if block.needs_api else None
    if kind == "shell":
        run_shell(block, host or "127.0.0.1:9", tmp_path)  # a block with no address runs offline (port 9: discard)
    elif kind == "python":
        run_python(block, host)
    elif kind == "yaml":
        run_yaml(block, tmp_path)
    else:
        run_json(block, tmp_path)


@pytest.mark.e2e
def test_every_route_is_documented(api):
    """The routes table of docs/ingest-and-api.md names every path the API serves."""
    documented = (REPO_ROOT / "docs" / "ingest-and-api.md").read_text()
    paths = api.get("/openapi.json")["paths"]
    missing = [path for path in paths if f"{path}`" not in documented]
    assert not missing, f"paths missing from docs/ingest-and-api.md: {missing}"


def github_anchor(heading: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def anchors_of(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)  # no headings in code
    return {github_anchor(match) for match in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_relative_links_resolve():
    broken = []
    for path in DOCUMENTS:
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not ours to check
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve() if file else path
            if not resolved.exists():
                broken.append(f"{path.name}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors_of(resolved):
                broken.append(f"{path.name}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_configuration_names_every_setting():
    configuration = (REPO_ROOT / "docs" / "configuration.md").read_text()
    missing = [name for name in Settings.model_fields if f"`{name}`" not in configuration]
    assert not missing, f"settings missing from docs/configuration.md's table: {missing}"
