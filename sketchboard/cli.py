"""`sketchboard`: run everything together (up) or each part alone."""

from __future__ import annotations

import argparse
import contextlib
import errno
import faulthandler
import gc
import logging
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

from pydantic import ValidationError

from catalog import ConfigError
from sketchboard import parent_death
from sketchboard.allocators import keep_freed_memory
from sketchboard.settings import Settings
from sketchboard.settings_errors import load_settings
from stopping.signals import stop_on_signals

log = logging.getLogger("sketchboard")

# The settings each common option sets.
_FLAGS = {"data_dir": "--data-dir", "streams_config": "--config", "host": "--host", "port": "--port"}


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {}
    for name in _FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    return load_settings(overrides, _FLAGS)


def cmd_check_config(args: argparse.Namespace) -> int:
    from sketchboard.wiring import open_catalog

    settings = _settings(args)
    catalog = open_catalog(settings)
    print(f"{settings.streams_config}: {len(catalog.streams)} streams, {len(catalog.metrics)} metrics - OK")
    for name, metric in catalog.metrics.items():
        print(f"  {name} ({metric.stream}): {', '.join(metric.stats())}")
    from sketchboard.wiring import alerts_file, dashboards_folder

    rules_path = alerts_file(settings)  # as the API finds it: a file named but missing is an error here too
    if rules_path is not None:
        from alerts.loader import load_rules_file

        rules = load_rules_file(rules_path, catalog)
        print(f"{rules_path}: {len(rules)} alert rules - OK")

    folder = dashboards_folder(settings)
    if folder is not None:
        from dashboard.provisioning import load_dashboards_dir

        dashboards = load_dashboards_dir(folder, catalog, max_points=settings.query_max_points)
        print(f"{folder}: {len(dashboards)} dashboards - OK")
    # Against the data already there, in the configured log and store (embedded or Kafka, SQLite or
    # PostgreSQL: sketchboard/config_against_data.py): a topic or log the API and the pipeline
    # refuse stops them from starting, so it fails the check; a changed definition is only said.
    from sketchboard.config_against_data import check_against_data

    found = check_against_data(settings, catalog)
    for note in found.notes:
        print(f"note: {note}")
    for error in found.errors:
        print(f"error: {error}", file=sys.stderr)
    return 1 if found.errors else 0


def cmd_token_create(args: argparse.Namespace) -> int:
    from api.security.scopes import parse_scopes
    from api.security.token_file import create_token

    settings = _settings(args)
    try:
        scopes = parse_scopes(args.scope)
    except ValueError as exc:
        raise ConfigError(f"--scope: {exc}") from None
    with _audit_log(settings) as audit, _tokens_file_undone_on_error(settings.tokens_path):
        token = create_token(settings.tokens_path, args.name, scopes, int(time.time() * 1000))
        audit("token.create", args.name, {"scopes": sorted(scopes)})
    # Only the token on stdout (`TOKEN=$(sketchboard token create ...)` works); the rest on stderr.
    print(token)
    print(f"sketchboard: token {args.name!r} ({', '.join(sorted(scopes))}) added to"
          f" {settings.tokens_path}; it is shown only now: keep it (clients send `Authorization: Bearer <token>`;"
          " the demo producer and bench scripts read SKETCHBOARD_TOKEN)", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _audit_log(settings: Settings):
    """Token changes go to the audit log too (GET /api/v1/audit), as made by this OS user: yields
    record(action, name, detail). Opened before the tokens file changes, so that a data dir it
    cannot use stops the command with the file as it was (not a token written, never shown, that
    a retry then finds there already)."""
    import getpass

    from sketchboard.wiring import open_audit_store, open_store

    store = open_store(settings)
    try:
        audit = open_audit_store(settings, store)
    except BaseException:
        store.close()
        raise

    def record(action: str, name: str, detail) -> None:
        audit.record(int(time.time() * 1000), f"cli:{getpass.getuser()}", action, target=name, detail=detail)

    try:
        yield record
    finally:
        audit.close()
        store.close()


@contextlib.contextmanager
def _tokens_file_undone_on_error(path: Path):
    """The tokens file as it was before, put back when the block fails (its audit entry could not
    be written): a change is in the file and the audit log, or in neither."""
    from api.security.token_file import read_tokens, write_tokens

    def content() -> bytes | None:
        return path.read_bytes() if path.exists() else None

    before, records = content(), read_tokens(path)
    try:
        yield
    except BaseException:
        if content() != before:  # changed before the failure
            if before is None:
                path.unlink(missing_ok=True)  # not an empty file: that would mean "tokens required"
            else:
                write_tokens(path, records)
        raise


def cmd_token_list(args: argparse.Namespace) -> int:
    from api.security.token_file import read_tokens
    from api.security.tokens import TokenRecord

    settings = _settings(args)
    rows = [(r, "settings") for r in (TokenRecord.from_dict(e) for e in settings.tokens)]
    rows += [(r, str(settings.tokens_path)) for r in read_tokens(settings.tokens_path)]
    if not rows:
        print(f"no tokens ({settings.tokens_path} does not exist or is empty): the API is open on loopback"
              " and refuses to listen elsewhere", file=sys.stderr)
    for record, source in rows:
        created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created_ms / 1000)) if record.created_ms else "-"
        print(f"{record.name}\t{','.join(sorted(record.scopes))}\t{created}\t{source}")
    return 0


def cmd_token_revoke(args: argparse.Namespace) -> int:
    from api.security.token_file import revoke_token

    settings = _settings(args)
    with _audit_log(settings) as audit, _tokens_file_undone_on_error(settings.tokens_path):
        revoke_token(settings.tokens_path, args.name)
        audit("token.revoke", args.name, None)
    print(f"sketchboard: token {args.name!r} revoked; a running API stops accepting it within a second",
          file=sys.stderr)
    return 0


def server_config(app, settings: Settings):
    """How uvicorn serves the API.

    http: uvicorn's httptools protocol (llhttp, C) with a cap of our own on a request's headers
    (sketchboard/http_protocol.py): h11, kept until session 102 for its 16 KiB cap, read a
    10 000-event body with ~45 % more of the event loop's CPU. loop: uvloop. The two took the API's
    CPU an event from 1.30-1.35 to 1.22-1.28 us under 10 000-event POSTs (docs/benchmarks.md).
    ws_max_size: a bigger frame is refused by the server before it is buffered (1009).
    ws_per_message_deflate: off unless asked (docs/benchmarks.md, session 69: deflating each
    client's snapshots in the event loop held REST queries up to a second under 50 clients)."""
    import uvicorn

    from sketchboard.http_protocol import served_as_the_api

    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level="warning", **served_as_the_api(),
                          ws_max_size=settings.ws_max_message_bytes, ws_per_message_deflate=settings.ws_compression)


def cmd_api(args: argparse.Namespace) -> int:
    import uvicorn

    from sketchboard.leader import stand_down
    from sketchboard.retention import retention_loop
    from sketchboard.wiring import build_api

    settings = _settings(args)
    app, ctx = build_api(settings)
    stop = threading.Event()

    # The API process owns the log's writes, so it also trims it (sketchboard/retention.py).
    threading.Thread(target=retention_loop, args=(ctx, settings, stop), name="retention", daemon=True).start()
    # Lag is sampled and alerts are evaluated in the API process (they matter most while the pipeline
    # is down), by one replica at a time: the one holding the leader lease (sketchboard/leader.py).
    ctx.leadership.start()
    workers = ctx.ingest_workers  # started once it serves (api/app.py)
    log.info("API on %s (data in %s; %s)", settings.base_url, settings.data_dir.resolve(),
             f"ingest in {workers.processes} worker processes" if workers is not None else "ingest in threads")
    try:
        # uvicorn's websockets-sansio protocol (its default) logs this error after any handshake
        # refused with an HTTP answer (the security middleware's 401/403), though the client got
        # that answer: one false ERROR line per refused connection. The ws route itself always
        # accepts first, so the line has no other source here.
        logging.getLogger("uvicorn.error").addFilter(
            lambda record: "returned without completing handshake" not in record.getMessage())
        # What start-up loaded (modules, catalog, clients) is moved out of the collector's reach: a
        # 24 h query makes tens of thousands of objects, and the full collections they set off
        # scanned the whole heap each time: 50-150 ms pauses in query times (docs/benchmarks.md).
        gc.collect()
        gc.freeze()
        server = uvicorn.Server(server_config(app, settings))
        _stop_server_on_signals(server)
        server.run()
        if not server.started and not server.should_exit:  # as uvicorn.run: it never served
            return 3
    finally:
        stop.set()
        # The leader's work stops and the webhook flushes its queue before the lease is handed over
        # (at once): released first, the lease would make the notifier count what is queued as standby.
        stand_down(ctx.leadership, alerts=ctx.alerts)
    return 0


def _stop_server_on_signals(server) -> None:
    """SIGTERM and SIGINT stop the API cleanly, with exit 0 and its `finally` run (the leader lease
    handed over at once, not waited out by the next replica).

    uvicorn takes both signals while it serves, then, once shut down, puts back the handlers it
    found and raises the signal again (uvicorn/server.py `capture_signals`): with Python's
    defaults that killed the process (-15) or raised KeyboardInterrupt past our `finally`. The
    handlers found are these, which only ask the server to stop, so the signal raised again does
    nothing more; one that comes before uvicorn serves makes it stop as soon as it has started."""
    def stop(signum, frame) -> None:
        server.should_exit = True

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)


def cmd_pipeline(args: argparse.Namespace) -> int:
    from sketchboard.javacheck import check_java
    from sketchboard.live import run_pipeline
    from sketchboard.pipeline_lock import PipelineRunning, hold_pipeline

    settings = _settings(args)
    if args.remove:
        return _remove_pipeline(settings, args)
    stopping = threading.Event()
    if not args.once:  # --once: Ctrl-C interrupts the drain as before
        stop_on_signals(stopping)
    name = args.name or settings.pipeline_name
    try:
        with hold_pipeline(name, settings.checkpoint_dir_of(name)):
            check_java()
            # Restarted in process when a switch fences a batch (docs/reprocessing.md#switch).
            return run_pipeline(settings, stopping, name=args.name, start=args.start, once=args.once,
                                freeze_start_up=True)
    except PipelineRunning as exc:
        print(f"sketchboard: {exc}", file=sys.stderr)
        return 2


def _remove_pipeline(settings: Settings, args: argparse.Namespace) -> int:
    from sketchboard.pipeline_lock import PipelineRunning
    from sketchboard.pipelines import RemoveRefused, remove_pipeline

    if args.name is None:
        print("sketchboard: --remove needs the pipeline's --name", file=sys.stderr)
        return 2
    try:
        with _audit_log(settings) as audit:
            removed = remove_pipeline(settings, args.name)
            audit("pipeline.remove", args.name, {"removed": removed})
    except (PipelineRunning, RemoveRefused) as exc:
        print(f"sketchboard: {exc}", file=sys.stderr)
        return 2
    print(f"sketchboard: pipeline {args.name!r} removed: {'; '.join(removed)}", file=sys.stderr)
    return 0


def cmd_reprocess(args: argparse.Namespace) -> int:
    """A reprocessing run of one stream (docs/reprocessing.md), with a progress bar on stderr."""
    from aggregates.reprocess import DefinitionUnchanged, RunNotResumable, SwitchRefused, UnknownRun, UnknownStream
    from sketchboard.reprocess import Interrupted, interrupt as raise_interrupted, run_reprocess
    from store.definitions import NotLaunched, RunGoing

    def interrupt(signum, frame):
        # SIGTERM (kill, a service manager) as Ctrl-C: the run is recorded failed and its pipeline
        # stopped on the way out, not left `running` (refused as going for 5 minutes). A second
        # signal ends the process at once.
        signal.signal(signum, signal.SIG_DFL)
        raise_interrupted(signum)

    before = {signum: signal.signal(signum, interrupt) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        run_reprocess(_settings(args), args.stream, run_id=args.run, switch=args.switch, launched=args.launched)
    except (UnknownStream, UnknownRun, RunNotResumable, DefinitionUnchanged, RunGoing, NotLaunched,
            SwitchRefused) as exc:
        # Refused as the API refuses it (404/409), with the reason: not a traceback.
        print(f"sketchboard: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        run = exc.run
        print(f"sketchboard: {exc}" + ("" if run is None else
              f": run {run.id!r} is recorded failed; resume it with `sketchboard reprocess {run.stream} --run"
              f" {run.id}`"), file=sys.stderr)
        return 128 + exc.signum
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import demo

    settings = _settings(args)
    argv = ["--url", args.url or settings.base_url, "--rate", str(_demo_rate(args, settings)),
            "--config", str(settings.streams_config), "--users", str(settings.demo_users),
            "--delayed-fraction", str(settings.demo_delayed_fraction), "--delay-mean", str(settings.demo_delay_mean),
            "--late-fraction", str(settings.demo_late_fraction), "--horizon-fraction", str(settings.demo_horizon_fraction),
            "--future-fraction", str(settings.demo_future_fraction)]
    if args.duration:
        argv += ["--duration", str(args.duration)]
    if settings.demo_postgres_dsn:  # the tables' rows go into PostgreSQL; the API follows them by CDC
        argv += ["--postgres-dsn", settings.demo_postgres_dsn]
    for spec in args.spike:
        argv += ["--spike", spec]
    token = settings.token.get_secret_value() if settings.token else None  # not in argv: ps would show it
    return demo.main(argv, token=token) or 0


def cmd_up(args: argparse.Namespace) -> int:
    """API, pipeline and demo producer as child processes; when one exits, all stop."""
    from sketchboard.javacheck import check_java

    check_java()
    settings = _settings(args)  # validated here, and the catalog too: fail once, not in three children
    from sketchboard.wiring import build_security, check_exposure, open_catalog

    open_catalog(settings)
    security = build_security(settings)
    check_exposure(settings, security)
    if security.tokens.required and not args.no_demo and settings.token is None:
        raise ConfigError("the API requires tokens, so the demo producer needs one: set SKETCHBOARD_TOKEN"
                          " (or `token:` in the settings file) to a token with the ingest scope"
                          " (`sketchboard token create demo --scope ingest`), or pass --no-demo")
    # Before any child starts: another program on the port would answer our health check (any
    # 200 on /healthz), and the pipeline and the demo would start against it.
    _check_port_free(settings.host, settings.port)
    env = {**os.environ, "SKETCHBOARD_DATA_DIR": str(settings.data_dir), "SKETCHBOARD_HOST": settings.host,
           "SKETCHBOARD_PORT": str(settings.port), "SKETCHBOARD_STREAMS_CONFIG": str(settings.streams_config),
           parent_death.ENV: str(os.getpid())}  # the children stop when this process dies (even SIGKILLed)
    exe = [sys.executable, "-m", "sketchboard.cli"]
    parts = [("api", [*exe, "api"]), ("pipeline", [*exe, "pipeline"])]
    if not args.no_demo:
        spikes = [arg for spec in args.spike for arg in ("--spike", spec)]
        parts.append(("demo", [*exe, "demo", "--rate", str(_demo_rate(args, settings)), *spikes]))
    children: dict[str, subprocess.Popen] = {}
    print(f"Sketchboard: {settings.base_url}  (data: {settings.data_dir.resolve()}; Ctrl-C stops)", flush=True)
    # `kill <pid>` (SIGTERM to this process alone, as a service manager sends it) must stop the
    # children too, not orphan them. The handler only sets a flag: raising from it could interrupt
    # Popen between fork and its return, leaving a started child that this process never learns of.
    stopping = threading.Event()
    stop_on_signals(stopping)
    try:
        for name, command in parts:
            if stopping.is_set():
                return 0
            children[name] = subprocess.Popen(command, env=env)
            if name == "api":
                _wait_healthy(settings.base_url, children[name], stopping)
        while not stopping.is_set():
            for name, child in children.items():
                code = child.poll()
                if code is not None:
                    print(f"sketchboard: {name} exited with {code}; stopping the others", file=sys.stderr)
                    return code or 1
            stopping.wait(0.5)
        return 0
    finally:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in children.values():
            try:
                child.wait(timeout=30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _check_port_free(host: str, port: int) -> None:
    """ConfigError when something listens on host:port already (another `sketchboard up`, or any
    other program): it accepts a connection, or the port cannot be bound as the API binds it
    (SO_REUSEADDR, as uvicorn does: a port a stopped run left in TIME_WAIT is free). An address
    that cannot be bound for another reason is the API's to report."""
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return
    in_use = ConfigError(f"port {port} is in use on {host}: another program (or another `sketchboard up`)"
                         " listens there; stop it, or pass --port")
    for family, kind, proto, _, address in addresses:
        # An unspecified address (0.0.0.0, ::) is reached on loopback.
        target = ({"0.0.0.0": "127.0.0.1", "::": "::1"}.get(address[0], address[0]), *address[1:])
        with contextlib.suppress(OSError), socket.socket(family, kind, proto) as client:
            client.settimeout(1.0)
            client.connect(target)
            raise in_use
        with contextlib.suppress(OSError), socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise in_use from None


def _wait_healthy(base_url: str, child: subprocess.Popen, stopping: threading.Event, timeout_s: float = 60) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping.is_set():
        if child.poll() is not None:
            raise SystemExit(f"sketchboard: the API exited with {child.returncode} while starting")
        try:
            if httpx.get(f"{base_url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        stopping.wait(0.2)
    if stopping.is_set():
        return
    raise SystemExit(f"sketchboard: the API did not answer on {base_url} within {timeout_s:.0f} s")


def _spike_spec(text: str) -> str:
    """Check a --spike spec here, so a typo fails before anything starts; pass the text on."""
    from demo import parse_spike  # imported only when --spike is given: numpy is slow to load

    parse_spike(text)
    return text


def _demo_rate(args: argparse.Namespace, settings) -> float:
    """--rate, else the demo_rate setting: 0 is a rate (no events), not "unset"."""
    return settings.demo_rate if args.rate is None else args.rate


def _rate(text: str) -> float:
    """Check a --rate here (a finite number >= 0), so `up --rate -50` fails before anything starts."""
    from demo.cli import rate_arg  # imported only when --rate is given: numpy is slow to load

    return rate_arg(text)


def _pipeline_name(text: str) -> str:
    from store.namespace import check_user_pipeline_name

    try:
        return check_user_pipeline_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _path(text: str) -> Path:
    if not text.strip():  # Path("") is the working directory: never what an empty argument meant
        raise argparse.ArgumentTypeError("must not be empty")
    return Path(text)


def _spike_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spike", type=_spike_spec, action="append", default=[], metavar="ENDPOINT:FACTOR:START:DURATION",
                   help="demo latency spike, e.g. /api/cart:40:20s:30s (x40 from 20 s after the demo starts,"
                        " for 30 s); repeatable")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sketchboard",
        description="Stream analytics from mergeable sketches. Settings: SKETCHBOARD_* environment variables"
        " or a YAML file (sketchboard.yaml, or the path in SKETCHBOARD_SETTINGS_FILE).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--data-dir", dest="data_dir", type=_path, help="where the log, store and checkpoints live")
        p.add_argument("--config", dest="streams_config", type=_path, help="streams and metrics YAML")
        p.add_argument("--host", help="API bind address (default 127.0.0.1)")
        p.add_argument("--port", type=int, help="API port (default 8000)")
        return p

    up = common(sub.add_parser("up", help="run the API, the pipeline and the demo producer together"))
    up.add_argument("--no-demo", action="store_true", help="do not start the demo producer")
    up.add_argument("--rate", type=_rate, help="demo events per second (0: none, the tables' rows only;"
                    " default: setting demo_rate)")
    _spike_option(up)
    up.set_defaults(func=cmd_up)
    common(sub.add_parser("api", help="run the HTTP API alone")).set_defaults(func=cmd_api)
    pipe = common(sub.add_parser("pipeline", help="run the Spark aggregation pipeline alone"))
    pipe.add_argument("--once", action="store_true", help="process what is in the log now, then exit")
    pipe.add_argument("--name", type=_pipeline_name, help="run this named pipeline (fan-out: several independent consumers of one log,"
                      " each with its own checkpoint, offsets, lag and store namespace); default: the serving"
                      " pipeline (setting pipeline_name), whose output the API serves")
    pipe.add_argument("--from", dest="start", choices=["earliest", "latest"],
                      help="where a pipeline's first run starts: the earliest retained record (replay) or the log's"
                      " end; only for a first run: a pipeline with a checkpoint resumes from it (default: setting"
                      " pipeline_start, earliest)")
    pipe.add_argument("--remove", action="store_true",
                      help="remove the named pipeline (--name): its output, checkpoint and consumer-registry record"
                      " (its lag); refused while it runs on this data directory")
    pipe.set_defaults(func=cmd_pipeline)
    reprocess = common(sub.add_parser(
        "reprocess", help="rebuild a stream whose definition changed: a second pipeline reads the log from its earliest"
        " retained offset into a versioned output beside the served one"))
    reprocess.add_argument("stream", help="the stream, with its configured definition")
    reprocess.add_argument("--run", help="carry out or resume this run of the stream: one recorded by POST"
                           " /api/v1/reprocess (the API's child), or one that failed or caught up (it reads on from"
                           " its checkpoint); refused while it is going in another process")
    reprocess.add_argument("--launched", action="store_true", help=argparse.SUPPRESS)  # the API's child: its run is ours
    reprocess.add_argument("--switch", action="store_true",
                           help="once caught up, serve its output (a stream feeding a window join: in step with the"
                                " serving pipeline, whose commits wait meanwhile)")
    reprocess.set_defaults(func=cmd_reprocess)
    demo = common(sub.add_parser("demo", help="send realistic demo traffic to a running API"))
    demo.add_argument("--url", help="API base URL (default from settings)")
    demo.add_argument("--rate", type=_rate, help="events per second before the daily shape (0: none, the tables'"
                      " rows only; default: setting demo_rate)")
    demo.add_argument("--duration", type=float, help="seconds to run (default: until stopped)")
    _spike_option(demo)
    demo.set_defaults(func=cmd_demo)
    common(sub.add_parser("check-config", help="validate the streams configuration")).set_defaults(func=cmd_check_config)
    token = sub.add_parser("token", help="API tokens: create (printed once), list, revoke").add_subparsers(
        dest="token_command", required=True, metavar="ACTION")
    create = common(token.add_parser("create", help="make a token and print it (only this once)"))
    create.add_argument("name", help="who or what uses it (shown in list and the audit log)")
    create.add_argument("--scope", action="append", required=True,
                        help="ingest, read or admin (admin implies the others); repeatable or comma-separated")
    create.set_defaults(func=cmd_token_create)
    common(token.add_parser("list", help="the tokens' names, scopes and creation times")).set_defaults(
        func=cmd_token_list)
    revoke = common(token.add_parser("revoke", help="remove a token from the tokens file"))
    revoke.add_argument("name")
    revoke.set_defaults(func=cmd_token_revoke)
    return parser


def _os_error_text(exc: OSError) -> str:
    """'<path>: <reason>' for an OSError about a file (not Python's '[Errno 2] ...: <path>')."""
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def _sqlite_error_text(exc: sqlite3.Error) -> str:
    """'<what>: <file>: <reason>' for a SQLite error (store/connection.py `naming_file` says the file)."""
    path = getattr(exc, "db_path", None)
    where = f"{path}: " if path is not None else ""
    return f"cannot open or write the SQLite file {where}{exc}" if where else f"SQLite: {exc}"


def _raised_in_py4j(exc: BaseException) -> bool:
    """Whether the error came from py4j's socket to the JVM (a frame of the py4j package raised it)."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__", "").startswith("py4j."):
            return True
        tb = tb.tb_next
    return False


def _stacks_on_sigusr1() -> None:
    """`kill -USR1 <pid>` prints every thread's Python stack to stderr, as jstack does for a JVM:
    for a process that hangs (docs/robustness.md). Not where stderr is no file (`main` called
    with stderr captured in memory, as by tests): faulthandler writes to a file descriptor."""
    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (AttributeError, ValueError, OSError):  # io.UnsupportedOperation is both of the last two
        pass


def main(argv: list[str] | None = None) -> int:
    # First: mimalloc reads its setting when pyarrow is loaded (sketchboard/allocators.py).
    allocators = keep_freed_memory()
    parent_death.die_with_parent()  # started by `sketchboard up`: stop when it dies
    _stacks_on_sigusr1()
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if allocators:
        logging.getLogger("sketchboard").debug("allocators keep freed memory: %s", "; ".join(allocators))
    for noisy in ("httpx", "py4j"):  # one line per request / per callback drowns the pipeline's own lines
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from aggregates.cluster import ExecutorEnvironmentError, SparkStartError
    from alerts.rules import RuleError
    from api.security.token_file import TokenFileError
    from dashboard.model import DashboardError
    from aggregates.checkpoint_checks import CheckpointDisagrees
    from ingest.log import LogUnavailable, TopicMismatch
    from sketchboard.javacheck import JavaError

    try:
        return args.func(args)
    except (ConfigError, JavaError, RuleError, TopicMismatch, LogUnavailable, TokenFileError,
            ExecutorEnvironmentError, SparkStartError, DashboardError, CheckpointDisagrees) as exc:
        for line in str(exc).splitlines() or [""]:  # one problem a line, each said by sketchboard
            print(f"sketchboard: {line}", file=sys.stderr)
        return 2
    except OSError as exc:  # a path that is missing, a folder, unreadable: named, with the reason
        if isinstance(exc, ConnectionError) and _raised_in_py4j(exc):
            # Not a path: the bridge to Spark's JVM (killed, out of memory, stopped by a signal).
            print(f"sketchboard: Spark's JVM went away ({exc}); its own lines above say why", file=sys.stderr)
            return 1
        print(f"sketchboard: {_os_error_text(exc)}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        print(f"sketchboard: invalid settings:\n{exc}", file=sys.stderr)
        return 2
    except sqlite3.Error as exc:  # a SQLite file that cannot be opened or written (a full disk at start)
        print(f"sketchboard: {_sqlite_error_text(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
