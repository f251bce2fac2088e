"""Real HTTP receivers for the sender's integration tests (see tests/receiver.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from ..receiver import Receiver


@pytest.fixture
def start_receiver() -> Iterator[Callable[[], Receiver]]:
    """Start as many receivers as a test needs; all are stopped after it."""
    started: list[Receiver] = []

    def start() -> Receiver:
        receiver = Receiver().start()
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.stop()


@pytest.fixture
def receiver(start_receiver: Callable[[], Receiver]) -> Receiver:
    """One running receiver; nothing is scripted yet (unscripted paths answer 404)."""
    return start_receiver()
