"""Fixtures for the integration tests (helpers live in harness.py)."""

from .harness import env  # noqa: F401
