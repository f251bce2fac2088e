"""Schemathesis against the served API (a real uvicorn on loopback): generated requests, with an
admin token and with a producer token, never get a 5xx and every answer matches /openapi.json
(its status, its media type, its schema). Bounded: a fixed seed, a fixed number of examples per
operation, long polls shortened (schemathesis_hooks.py), and a hard limit on the wall-clock
time of both runs together, well under a minute on two cores."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from outbox import DestinationSpec, Outbox, Role, Settings
from outbox.app.api import begin_shutdown
from outbox.app.service import create_service
from outbox.grants import GrantSpec

from ..conftest import SECRET
from ..servers import Served

CHECKS = ",".join([
    "not_a_server_error",
    "response_schema_conformance",
    "status_code_conformance",
    "content_type_conformance",
])
SEED = 20261130
HOOKS = Path(__file__).with_name("schemathesis_hooks.py")
EXAMPLES_PER_OPERATION = 10
#: Both runs together, wall clock: a guard against a hang, not a measure of speed (they take about
#: 20 s on two idle cores), so it is generous enough for a loaded CI machine.
BUDGET_SECONDS = 240


@dataclass
class Target:
    url: str
    admin: str
    producer: str  # scope acme only
    workdir: Path


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Target]:
    """The API (no embedded sender, grants authority) on a real SQLite file, with destination
    ``billing``, a grant letting scope ``acme`` reach it (so the documented example enqueues)
    and the two tokens."""
    db_url = f"sqlite:///{tmp_path / 'fuzz.db'}"

    async def prepare() -> tuple[str, str]:
        async with await Outbox.open(db_url) as box:
            await box.put_destination("billing", DestinationSpec(url="https://billing.example/hook", secret=SECRET))
            await box.put_grant("acme-billing", GrantSpec(scope="acme", destination="billing"))
            admin, _ = await box.create_token(Role.ADMIN)
            producer, _ = await box.create_token(Role.PRODUCER, ["acme"])
        return admin, producer

    admin, producer = asyncio.run(prepare())
    app = create_service(Settings(database_url=db_url, worker=False, authority="grants"))
    served = Served(app)
    workdir = tmp_path / "schemathesis"
    workdir.mkdir()
    try:
        yield Target(served.url, admin, producer, workdir)
    finally:
        begin_shutdown(app)  # a long poll still open answers now
        served.stop()


def schemathesis(target: Target, token: str, *options: str) -> subprocess.Popen[str]:
    """Start the schemathesis CLI against the served document."""
    command = [
        sys.executable, "-m", "schemathesis.cli", "--no-color", "run", f"{target.url}/openapi.json",
        "--header", f"Authorization: Bearer {token}",
        "--checks", CHECKS,
        "--max-examples", str(EXAMPLES_PER_OPERATION),
        "--seed", str(SEED),
        "--workers", "1",
        "--no-shrink",
        "--generation-database", "none",
        "--request-timeout", "10",
        *options,
    ]
    return subprocess.Popen(command, cwd=target.workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS)})


def finished(run: subprocess.Popen[str], deadline: float, who: str) -> str:
    """The run's output once it ended cleanly; a failure if it found something or ran too long."""
    try:
        output, _ = run.communicate(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        run.kill()
        output, _ = run.communicate()
        pytest.fail(f"schemathesis {who} ran over the {BUDGET_SECONDS} s budget:\n{output[-6000:]}")
    assert run.returncode == 0, f"schemathesis {who}:\n{output[-10000:]}"
    selected = re.search(r"Operations:\s+(\d+) selected / (\d+) total", output)
    assert selected and int(selected.group(1)) > 0, output[-4000:]
    return output


def test_generated_requests_get_no_5xx_and_match_the_document(target: Target):
    deadline = time.monotonic() + BUDGET_SECONDS
    # both at once (two cores): an admin reaches every operation; a producer only the intents,
    # where its scopes make the difference, and no long stateful scenarios
    admin = schemathesis(target, target.admin, "--phases", "examples,coverage,fuzzing,stateful")
    producer = schemathesis(target, target.producer, "--include-tag", "intents",
                            "--phases", "examples,coverage,fuzzing")
    try:
        admin_output = finished(admin, deadline, "with an admin token")
        finished(producer, deadline, "with a producer token")
    finally:
        for run in (admin, producer):
            if run.poll() is None:
                run.kill()
                run.communicate()
    selected = re.search(r"Operations:\s+(\d+) selected / (\d+) total", admin_output)
    assert selected and selected.group(1) == selected.group(2), "the admin run skipped operations"
