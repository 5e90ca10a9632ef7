"""The switch scenario the reprocess tests share (tests/spark/test_reprocess_*.py): a serving
pipeline reads the log with the old definition, the definition changes, a reprocessing run
rebuilds the changed stream or table, the log is appended to after the run caught up (read the
old way by the serving pipeline before the switch) and when the switch comes (left unread by
it), the switch moves the outputs, the serving pipeline restarts (as `sketchboard pipeline` does
after a switch) and a reference pipeline reads the whole log once with the new definition. A
test states its configuration, the data of each phase and what it expects of the outcome:

    with SwitchScenario(tmp_path, spark, log_backend, OLD, NEW, batch=150) as scenario:
        traffic = Traffic(Log(scenario.log, scenario.catalog))
        done = scenario.switch_of("users", first=lambda: traffic.both(2, 6, 60),
                                  changed=lambda: traffic.both(2, 5, 60), after_run=..., at_switch=...)
        assert stored(done.root) == stored(done.reference) == expected(traffic.log)

The steps are methods too (`serve`, `change`, `reprocess`, ...) for a test that stops
earlier. Every store and the log are closed when the `with` block ends."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from aggregates.reprocess import NeedsAlignment
from catalog import Catalog
from sketchboard.reprocess import build_reprocess_service, run_reprocess, switch_run
from sketchboard.settings import Settings
from sketchboard.wiring import build_pipeline, open_store
from store.definitions import DefinitionStore


def nothing() -> None:
    """A phase that appends nothing."""


def plain_switch_refused(match: str) -> Callable[[object, object], None]:
    """A `caught_up` check: a plain switch (the API's) of the run is refused, saying `match` (it
    cannot run the run's final batch in step with the serving pipeline)."""
    def check(service, run) -> None:
        with pytest.raises(ValueError, match=match):
            service.switch(run.id)
    return check


def hour_ago() -> int:
    """The hour boundary one to two hours back: a timeline's seconds count from it."""
    return (int(time.time() * 1000) // 3_600_000 - 1) * 3_600_000


@dataclass
class Switched:
    """The outcome of a switch scenario: the run, the switch's answer, the serving store (the
    root, switched) and the reference pipeline's store over the whole log."""

    run: object  # aggregates.reprocess.ReprocessRun
    service: object  # aggregates.reprocess.ReprocessService
    switched: dict
    root: object
    reference: object


class SwitchScenario:
    """One switch test's log, configuration file and pipelines (see the module doc). `old` and
    `new` are the catalogs' declarations; `batch` is the serving pipeline's and the run's
    max_records_per_batch. `log` is the log opened with the new definition (the events are
    validated with it)."""

    def __init__(self, tmp_path: Path, spark, log_backend, old: dict, new: dict, *, batch: int):
        self.spark, self.old, self.new = spark, old, new
        self.test_log = log_backend.new(tmp_path / "data")
        self.config = tmp_path / "streams.yaml"
        self.config.write_text(yaml.safe_dump(old))
        self.settings = Settings(data_dir=self.test_log.root, streams_config=self.config, alerts_config=None,
                                 max_records_per_batch=batch, **self.test_log.settings())
        self.catalog = Catalog(**new)
        self.log = self.test_log.open(self.catalog)
        self.main = None  # the serving pipeline
        self._opened: list = []

    def __enter__(self) -> SwitchScenario:
        return self

    def __exit__(self, *exc) -> None:
        for store in reversed(self._opened):
            store.close()
        self.log.close()

    def _close(self, pipeline) -> None:
        self._opened.remove(pipeline.store)
        pipeline.store.close()

    def _keep(self, pipeline):
        self._opened.append(pipeline.store)
        return pipeline

    @property
    def root(self):
        """The serving pipeline's store (the root store)."""
        return self.main.store

    def serve(self):
        """The serving pipeline (re)started with the configuration file as it is, drained."""
        if self.main is not None:
            self._close(self.main)
        self.main = self._keep(build_pipeline(self.settings, self.spark))
        self.main.run_until_drained()
        return self.main

    def change(self) -> None:
        """The configuration file now declares the new definition (still served the old way)."""
        self.config.write_text(yaml.safe_dump(self.new))

    def reprocess(self, stream: str):
        """A run of `stream` (as `sketchboard reprocess STREAM` starts it), caught up; the
        reprocessing service over the serving store."""
        run = run_reprocess(self.settings, stream, spark=self.spark, out=io.StringIO(), interval_s=0.05)
        assert run.state == "caught_up"
        return run, build_reprocess_service(self.settings, self.catalog, self.root, self.log)

    def output(self, run=None):
        """The run's output store (its namespace; the root store when None: another reader of
        it), closed at the end."""
        store = open_store(self.settings) if run is None else open_store(self.settings, run.id)
        self._opened.append(store)
        return store

    def pipeline(self, name: str = "main", **settings):
        """Another pipeline over the log (with these settings changed), drained; its store is
        closed at the end."""
        options = {"name": name, "starting_offsets": "earliest"} if name != "main" else {}
        pipeline = self._keep(build_pipeline(self.settings.model_copy(update=settings), self.spark, **options))
        pipeline.run_until_drained()
        return pipeline

    def switch_of(self, stream: str, *, first: Callable[[], None], changed: Callable[[], None],
                  after_run: Callable[[], None], at_switch: Callable[[], None],
                  after_switch: Callable[[], None] = nothing, after_restart: Callable[[], None] | None = None,
                  tail: Callable[[], None] | None = None,
                  served: Callable[[object], None] = lambda root: None,
                  caught_up: Callable[[object, object], None] = lambda service, run: None,
                  during_switch: Callable[[], AbstractContextManager] = nullcontext,
                  synchronized: bool = True, reference_batch: int | None = None) -> Switched:
        """The whole scenario for a run of `stream`. Each phase appends to the log:
        `first` before the serving pipeline's first run (old definition), `changed` after the
        definition changed (the serving pipeline reads it the old way before the run),
        `after_run` after the run caught up (read by the serving pipeline before the switch),
        `at_switch` when the switch comes (left unread by it), `after_switch` before the serving
        pipeline restarts (it then reads from the run's end: after_run, at_switch and
        after_switch in one drain), `after_restart` after that drain (it drains again: for a
        backlog that would not fit one batch) and `tail` after the reference pipeline drained (then both
        drain once more: a pattern's watermark is its streams' as of the batch before).
        `served(root)` checks the serving store before the run, `caught_up(service, run)` the
        run before the switch; `during_switch()` is entered around the switch (a reader
        polling throughout it). `synchronized`: the switch `sketchboard reprocess --switch`
        makes (in step with the serving pipeline), else the API's plain one (which, when the
        serving pipeline has read further than the run, has its child read on first).
        `reference_batch`: the reference pipeline's max_records_per_batch (the serving one's
        when None)."""
        first()
        self.serve()
        self.change()
        changed()
        self.serve()
        served(self.root)
        run, service = self.reprocess(stream)
        caught_up(service, run)
        after_run()
        self.main.run_until_drained()
        at_switch()
        with during_switch():
            if synchronized:
                switched = switch_run(self.settings, service, service.run(run.id), self.spark, self.root)
            else:
                try:
                    switched = service.switch(run.id)
                except NeedsAlignment:  # the serving pipeline read further (after_run): the API's child reads on
                    switched = switch_run(self.settings, service, service.run(run.id), self.spark, self.root)
        assert switched["serving_version"] == run.version
        assert DefinitionStore(self.root.side_db()).holds() == {}  # released by the switch
        after_switch()
        again = self.pipeline()  # as `sketchboard pipeline` restarts after a switch
        assert again.store is not self.root
        if after_restart is not None:
            after_restart()
            again.run_until_drained()
        batch = {} if reference_batch is None else {"max_records_per_batch": reference_batch}
        reference = self.pipeline("reference", **batch)
        if tail is not None:
            tail()
            for pipeline in (again, reference):
                pipeline.run_until_drained()
        self._close(again)
        return Switched(run, service, switched, self.root, reference.store)
