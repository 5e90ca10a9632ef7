"""Settings for the command line: each problem one line, naming the setting and where its value
came from (the option, the environment variable, the settings file's line), a secret's value
never shown."""

from __future__ import annotations

import json
import os
import re
import shlex
from typing import Any

import pydantic_settings
from pydantic import ValidationError

from catalog import ConfigError
from sketchboard.settings import Settings, did_you_mean, read_settings_file, settings_file


class InvalidSettings(ConfigError):
    """Settings that cannot be used: one problem a line, each naming the setting and, when it can
    be known, where its value came from."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


def load_settings(overrides: dict[str, Any] | None = None, flags: dict[str, str] | None = None) -> Settings:
    """Settings(**overrides) for the command line: what is wrong as InvalidSettings (flags: the
    option each override came from, e.g. {"port": "--port"})."""
    overrides = dict(overrides or {})
    try:
        return Settings(**overrides)
    except pydantic_settings.SettingsError as exc:  # a list or mapping variable that is not JSON
        match = re.search(r'field "(\w+)"', str(exc))
        field = match.group(1) if match else None
        cause = exc.__cause__
        reason = (f"not valid JSON (lists and mappings are given as JSON): {cause}"
                  if isinstance(cause, json.JSONDecodeError) else str(cause or exc))
        if field is None:
            raise InvalidSettings([f"settings: {reason}"]) from None
        raise InvalidSettings([f"setting {field}{_where(field, overrides, flags or {})}: {reason}"]) from None
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            message = error["msg"].removeprefix("Value error, ")
            loc = [str(part) for part in error["loc"]]
            if error["type"] == "extra_forbidden" and len(loc) == 1:  # a key of the settings file
                message = f"no such setting{did_you_mean(loc[0], Settings.model_fields)}"
            if not loc:  # a check of several settings together (log_backend kafka without servers, ...)
                problems.append(f"settings: {message}")
                continue
            where = _where(loc[0], overrides, flags or {})
            problems.append(f"setting {'.'.join(loc)}{where}: {message}")
        raise InvalidSettings(list(dict.fromkeys(problems))) from None


# Values not echoed in an error: secrets, or settings that may hold one (a DSN's password, a SASL
# password among the Kafka options, a webhook URL's token).
_NOT_SHOWN = frozenset({"token", "tokens", "postgres_dsn", "demo_postgres_dsn", "alert_webhook_url", "kafka_options",
                        "kafka_source_options", "spark_conf"})


def _shown(field: str, value: Any) -> str:
    if field in _NOT_SHOWN:
        return ""
    text = shlex.quote(str(value))
    return "=" + (text if len(text) <= 60 else text[:57] + "...")


def _env_name(field: str) -> str | None:
    wanted = f"SKETCHBOARD_{field}".upper()
    return next((name for name in os.environ if name.upper() == wanted), None)


def _where(field: str, overrides: dict[str, Any], flags: dict[str, str]) -> str:
    """' (<source>)' for a setting's value: the command-line option, the environment variable or
    the settings file and line it came from, in that order of precedence; '' if none is known."""
    if field in overrides:
        flag = flags.get(field)
        return f" ({flag} {shlex.quote(str(overrides[field]))})" if flag else ""
    env = _env_name(field)
    if env is not None:
        return f" ({env}{_shown(field, os.environ[env])})"
    try:
        path = settings_file()
        document = read_settings_file(path) if path is not None else None
    except (OSError, ConfigError):
        return ""
    if document is not None and field in document.value:
        return f" ({path}, line {document.line((field,))})"
    return ""
