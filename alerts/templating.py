"""Labels and annotations with the value templated in, in the spelling Prometheus rule
files use: `{{ $value }}`, `{{ $labels.endpoint }}`, plus `{{ $rule }}` and `{{ $state }}`.
A small fixed language on purpose: templates come from API users, so no code runs."""

from __future__ import annotations

import re
from collections.abc import Mapping

# DOTALL: a placeholder spread over lines is one too (it was never checked, and rendered as written).
_PLACEHOLDER = re.compile(r"\{\{\s*(.*?)\s*\}\}", re.DOTALL)
_VARIABLE = re.compile(r"\A\$(value|rule|state|labels\.([A-Za-z_][A-Za-z0-9_]*))\Z")


def check_template(text: str) -> None:
    """Raise ValueError naming the first placeholder that is not one of ours."""
    if text.count("{{") != text.count("}}"):
        raise ValueError(f"unbalanced '{{{{' and '}}}}' in {text!r}")
    for match in _PLACEHOLDER.finditer(text):
        if not _VARIABLE.match(match.group(1)):
            raise ValueError(f"unknown placeholder {match.group(0)!r}; use {{{{ $value }}}}, {{{{ $labels.NAME }}}},"
                             " {{ $rule }} or {{ $state }}")


def format_value(value: float | str | None) -> str:
    """Compact, like Prometheus' humanize for plain numbers: 250, 0.0123, 1.235e+06."""
    if value is None:
        return "no data"
    if isinstance(value, str):
        return value
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.4g}"


def render(text: str, *, value: float | str | None, labels: Mapping[str, str], rule: str, state: str) -> str:
    def substitute(match: re.Match) -> str:
        found = _VARIABLE.match(match.group(1))
        if found is None:  # checked when the rule was accepted; keep the text rather than fail
            return match.group(0)
        name, label = found.groups()
        if label is not None:
            return labels.get(label, "")
        return {"value": format_value(value), "rule": rule, "state": state}[name]

    return _PLACEHOLDER.sub(substitute, text)


def render_all(templates: Mapping[str, str], **context) -> dict[str, str]:
    return {key: render(text, **context) for key, text in templates.items()}
