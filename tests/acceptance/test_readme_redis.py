"""The README's Redis Streams example runs as printed, as a script, against a private redis-server."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from receivers import wire
from tests.conftest import SECRET
from tests.redis_servers import RedisServer, private_redis

from .test_readme import python_blocks

__all__ = ["private_redis"]  # the fixture used here


def test_the_redis_example_adds_one_signed_entry_and_prints_it(private_redis: RedisServer, tmp_path: Path):
    script = tmp_path / "redis_example.py"
    script.write_text(python_blocks()["redis"])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "REDIS_PORT": str(private_redis.port), "REDIS_SIGNING_SECRET": SECRET})
    assert done.returncode == 0, done.stderr
    status, entry_line = done.stdout.splitlines()
    state, entry = status.split(" ")
    assert state == "delivered"
    printed, fields_text = entry_line.split(" ", 1)
    fields = ast.literal_eval(fields_text)
    assert printed == entry
    assert fields["idempotency-key"] == "acme/order-42-paid" and fields["outbox-fence"] == "1"
    assert fields["payload"] == '{"event":"paid","order":42}'
    assert fields["payload-digest"].startswith("sha256:") and fields["webhook-signature"].startswith("v1,")
    assert fields["webhook-signature"] == wire.sign([SECRET], "acme/order-42-paid", int(fields["webhook-timestamp"]),
                                                    fields["payload"].encode())
    assert (tmp_path / "redis.db").exists()
