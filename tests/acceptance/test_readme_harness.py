"""The README's Pydantic AI harness example, run as printed against a real served outbox whose
worker delivers to a real receiver: the model is told the delivery, and a second run enqueues
nothing new (the same conversation and tool call id are the same intent) and tells it the same."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from outbox import DestinationSpec, Outbox, Role, Settings

from ..conftest import SECRET, rows
from ..harness.extra import require_pydantic_ai
from ..receiver import Receiver, Reply
from .test_readme import python_blocks

require_pydantic_ai()

PREFIX = "the model was told: "


async def test_the_harness_example_tells_the_model_and_enqueues_once(tmp_path: Path, receiver: Receiver,
                                                                     serve_api: Callable[[Settings], str]) -> None:
    receiver.script("/billing", Reply(200, body={"external_id": "inv-1"}))
    db_url = f"sqlite:///{tmp_path / 'served.db'}"
    async with await Outbox.open(db_url) as box:
        await box.put_destination("billing", DestinationSpec(url=f"{receiver.url}/billing", secret=SECRET,
                                                             allow_private_network=True))
        token, _ = await box.create_token(Role.PRODUCER, ["acme"])
    url = serve_api(Settings(database_url=db_url, worker=True, authority="allow-all", poll_seconds=0.05))
    script = tmp_path / "harness_example.py"
    script.write_text(python_blocks()["harness-pydantic-ai"])
    told = []
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=90, env={"OUTBOX_URL": url, "OUTBOX_TOKEN": token, "PATH": "/usr/bin"})
        assert done.returncode == 0, done.stderr
        line = done.stdout.strip()
        assert line.startswith(PREFIX), done.stdout
        told.append(json.loads(line.removeprefix(PREFIX)))
    assert told[0] == told[1]
    assert told[0]["status"] == "delivered" and told[0]["external_id"] == "inv-1" and told[0]["attempts"] == 1
    assert told[0]["action_id"].startswith("call-")
    assert await rows(db_url, "SELECT action_id FROM intents") == [(told[0]["action_id"],)]
    assert len(receiver.requests("/billing")) == 1
