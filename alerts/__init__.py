"""Alert rules, evaluation and notifiers (to come)."""
