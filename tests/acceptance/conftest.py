"""What the acceptance tests share: the installed ``outbox`` command, an environment without the
developer's own ``OUTBOX_*`` settings, and a scripted receiver on uvicorn."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..receiver import Receiver

OUTBOX = str(Path(sys.executable).parent / "outbox")


def clean_env(**settings: str) -> dict[str, str]:
    """This process's environment without any ``OUTBOX_*`` variable, plus ``settings``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("OUTBOX_")}, **settings}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver().start()
    yield started
    started.stop()
