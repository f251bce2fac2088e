"""The README's SQS example runs as printed, against moto's server (the README's way to try it
without AWS), as a script in a fresh directory."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

from tests.sqs import MotoServer

from .test_readme import README, VENV_BIN, bash, python_blocks


def test_the_sqs_example_delivers_one_message_with_its_identity(moto: MotoServer, tmp_path: Path):
    section = README.read_text().split("### SQS\n", 1)[1].split("\n### ", 1)[0]
    assert "`moto_server -p\n4566`" in section and (VENV_BIN / "moto_server").exists()
    (tmp_path / "sqs_example.py").write_text(python_blocks()["sqs"])
    shown = bash("python sqs_example.py", tmp_path, SQS_ENDPOINT=moto.endpoint)
    status, message = shown.splitlines()
    outcome, message_id = status.split(" ")
    assert outcome == "delivered" and len(message_id) == 36  # a MessageId, the attempt's external id
    body, group, attributes = message.split(" ", 2)
    assert (body, group) == ('{"event":"paid","order":42}', "order-42")
    printed = ast.literal_eval(attributes)
    assert printed["idempotency-key"] == "acme/order-42-paid" and printed["outbox-fence"] == "1"
    assert printed["payload-digest"] == "sha256:" + hashlib.sha256(body.encode()).hexdigest()
    assert printed["webhook-signature"].startswith("v1,") and json.loads(body) == {"event": "paid", "order": 42}
