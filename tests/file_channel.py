"""A channel that exists for the registry's tests: it appends each payload's ``line`` to a file.

It is everything a new channel is, in one module: its name, the spec its destinations are
registered with, the check its payloads pass at enqueue, and the implementation a worker sends
through. Nothing else in the project names it; the tests install it with ``channels.register``
(a channel shipped in a distribution declares itself under the ``outbox.channels`` entry points
instead).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from outbox import Destination, DestinationSpec, Intent, Outcome, Submission
from sender.channel import ChannelModule, ProbeAnswer, Send, SendResult


class FileSpec(DestinationSpec):
    """A file destination: the file each payload's line is appended to."""

    model_config = ConfigDict(extra="forbid")

    channel: Literal["file"]
    path: str = Field(description="absolute path of the file")

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not Path(path).is_absolute():
            raise ValueError(f"path {path!r} must be absolute")
        return path


def check_payload(payload: Any) -> None:
    if not isinstance(payload, dict) or not isinstance(payload.get("line"), str):
        raise ValueError("a file payload is an object with a string 'line'")


class FileChannel:
    """Appends one JSON line per attempt (key, line, fence) and syncs it before saying so; a
    worker's cycle of attempts (``send_many``) is one write and one sync per file."""

    async def send(self, intent: Intent, destination: Destination, *, attempt_id: str, fence: int) -> SendResult:
        return (await self.send_many([Send(intent, destination, attempt_id, fence)]))[0]

    async def send_many(self, sends: Sequence[Send]) -> list[SendResult]:
        by_path: dict[str, list[int]] = {}
        for i, send in enumerate(sends):
            by_path.setdefault(send.destination.settings["path"], []).append(i)
        results: dict[int, SendResult] = {}
        for path, places in by_path.items():
            lines = [json.dumps({"key": sends[i].intent.key, "line": json.loads(sends[i].intent.payload_json)["line"],
                                 "fence": sends[i].fence}) + "\n" for i in places]
            try:
                with open(path, "a", encoding="utf-8") as file:
                    offset = file.tell()
                    file.write("".join(lines))
                    file.flush()
                    os.fsync(file.fileno())
            except OSError as exc:  # a write may have begun: not proof that nothing was written
                results.update((i, SendResult(Submission.MAYBE_SUBMITTED, Outcome.UNKNOWN, error=str(exc)))
                               for i in places)
                continue
            for i, line in zip(places, lines, strict=True):
                results[i] = SendResult(Submission.SUBMITTED, Outcome.DELIVERED, external_id=f"offset {offset}",
                                        answered=True)
                offset += len(line.encode())
        return [results[i] for i in range(len(sends))]

    async def probe(self, intent: Intent, destination: Destination, *, fence: int) -> ProbeAnswer:
        return ProbeAnswer(None, error="a file cannot be asked")

    async def aclose(self) -> None:
        return None


CHANNEL = ChannelModule(name="file", spec=FileSpec, needs_secret=False, check_payload=check_payload,
                        open=lambda concurrency: FileChannel())
