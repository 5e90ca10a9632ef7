"""Benchmarks: throughput of the pieces and of the running service."""
