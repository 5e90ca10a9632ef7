"""Helpers shared by tests of every kind (no fixtures here: those live in conftest.py files)."""
