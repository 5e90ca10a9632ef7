"""The alerts YAML file (`config/alerts.yaml` by default): rules declared with the service's
configuration, loaded at start. Its rules are read-only through the API (the file is their
source of truth), as Grafana's provisioned rules are."""

from __future__ import annotations

from pathlib import Path

from alerts.rules import Rule, RuleError, parse_rule
from catalog import Catalog, ConfigError
from catalog.loader import read_yaml


def load_rules_file(path: Path, catalog: Catalog) -> dict[str, Rule]:
    """Every rule of the file, validated; a problem raises RuleError naming the file and the rule."""
    try:  # read as every YAML file of the service is: a key written twice is refused, with its line
        document = read_yaml(path, "alert rules file").value or {}
    except ConfigError as exc:
        raise RuleError(str(exc)) from None
    if not isinstance(document, dict) or not isinstance(document.get("rules", []), list):
        raise RuleError(f"{path}: expected a mapping with a list under 'rules'")
    unknown = sorted(set(document) - {"rules"})
    if unknown:
        raise RuleError(f"{path}: unknown top-level keys {unknown}; only 'rules' is allowed")
    rules: dict[str, Rule] = {}
    for index, item in enumerate(document.get("rules") or []):
        try:
            rule = parse_rule(item, catalog)
        except RuleError as exc:
            raise RuleError(f"{path}: rules[{index}]: {exc}") from None
        if rule.name in rules:
            raise RuleError(f"{path}: rules[{index}]: a second rule named {rule.name!r}")
        rules[rule.name] = rule
    return rules
