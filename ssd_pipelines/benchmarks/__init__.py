"""Measurements anyone can rerun: each module prints a table and writes it under docs/."""
