"""The README's Pydantic AI harness example, run as printed against a real served outbox whose
worker delivers to a real receiver: the model is told the delivery, and a second run enqueues
nothing new (the same conversation and tool call id are the same intent) and tells it the same."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from outbox import Settings

from ..conftest import rows
from ..harness.extra import require_pydantic_ai
from ..receiver import Receiver, Reply
from .test_readme import python_blocks
from .test_readme_client import run_client_example

require_pydantic_ai()

PREFIX = "the model was told: "


async def test_the_harness_example_tells_the_model_and_enqueues_once(tmp_path: Path, receiver: Receiver,
                                                                     serve_api: Callable[[Settings], str]) -> None:
    db_url = f"sqlite:///{tmp_path / 'served.db'}"
    outputs = await run_client_example(python_blocks()["harness-pydantic-ai"], tmp_path, receiver, serve_api,
                                       Reply(200, body={"external_id": "inv-1"}))
    told = []
    for output in outputs:
        line = output.strip()
        assert line.startswith(PREFIX), output
        told.append(json.loads(line.removeprefix(PREFIX)))
    assert told[0] == told[1]
    assert told[0]["status"] == "delivered" and told[0]["external_id"] == "inv-1" and told[0]["attempts"] == 1
    assert told[0]["action_id"].startswith("call-")
    assert await rows(db_url, "SELECT action_id FROM intents") == [(told[0]["action_id"],)]
    assert len(receiver.requests("/billing")) == 1
