"""Fixtures the fault matrix's modules share: the store each row runs on (SQLite, PostgreSQL),
defined with the webhook rows."""

from .test_matrix import store_url  # noqa: F401
