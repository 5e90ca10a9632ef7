"""Alert rules (rules, loader), their evaluation (kinds, evaluator, machine, service over
source's data) and notifiers (webhook, with dedup and templating)."""
