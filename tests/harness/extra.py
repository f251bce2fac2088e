"""The ``pydantic-ai`` extra: its tests skip without it, and fail under CI=true, where the test
extra installs it and a skip would pass unnoticed."""

from __future__ import annotations

import os

import pytest


def require_pydantic_ai() -> None:
    """Skip the calling module without the extra, or fail it under CI=true."""
    if os.environ.get("CI") == "true":
        import pydantic_ai  # noqa: F401  (missing: an ImportError, and the module fails)
    else:
        pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")
