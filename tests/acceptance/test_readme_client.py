"""The README's Python client example, run as printed against a real ``outbox serve`` whose
worker delivers to a real receiver: it enqueues, reads back, is refused a conflicting intent and
sees the delivery, and a second run finds the intent already enqueued and sends nothing again."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from outbox import DestinationSpec, Outbox, Role, Settings

from ..conftest import SECRET
from ..receiver import Receiver, Reply
from .test_readme import python_blocks


async def run_client_example(code: str, tmp_path: Path, receiver: Receiver, serve_api: Callable[[Settings], str],
                             reply: Reply) -> list[str]:
    """Run ``code`` twice in a subprocess against a served outbox (its worker delivering
    ``billing`` to ``receiver``, which answers ``reply``; its database is ``tmp_path/served.db``;
    a producer's token for scope acme in OUTBOX_TOKEN); returns each run's output."""
    receiver.script("/billing", reply)
    db_url = f"sqlite:///{tmp_path / 'served.db'}"
    async with await Outbox.open(db_url) as box:
        await box.put_destination("billing", DestinationSpec(url=f"{receiver.url}/billing", secret=SECRET,
                                                             allow_private_network=True))
        token, _ = await box.create_token(Role.PRODUCER, ["acme"])
    url = serve_api(Settings(database_url=db_url, worker=True, authority="allow-all", poll_seconds=0.05))
    script = tmp_path / "example.py"
    script.write_text(code)
    outputs = []
    for _ in range(2):
        done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                              timeout=90, env={"OUTBOX_URL": url, "OUTBOX_TOKEN": token, "PATH": "/usr/bin"})
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    return outputs


async def test_the_client_example_runs_against_a_served_outbox(tmp_path: Path, receiver: Receiver,
                                                               serve_api: Callable[[Settings], str]) -> None:
    first, again = await run_client_example(python_blocks()["client"], tmp_path, receiver, serve_api,
                                            Reply(200, headers={"External-Id": "inv-981"}))
    assert [r.headers["idempotency-key"] for r in receiver.requests("/billing")].count("acme/invoice-42-send") == 1
    assert first.splitlines()[:3] == ["created pending", "10 of 10 accepted", "refused: 409 intent-conflict"]
    assert first.splitlines()[3] == "delivered [('submitted', 'delivered')]"
    assert again.splitlines()[0] == "already enqueued delivered"
