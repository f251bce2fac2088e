"""The README's tracing example runs as printed and prints one trace: the producer's span, the
intent's create span under it, and the attempt's send span under that."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from .test_readme import README, python_blocks


def test_the_tracing_example_prints_one_trace(tmp_path: Path):
    script = tmp_path / "tracing_example.py"
    script.write_text(python_blocks()["tracing"])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    section = README.read_text().split("### Tracing\n", 1)[1]
    printed = re.search(r"It prints one trace:\n\n```\n(.*?)```", section, re.S)
    assert printed is not None
    assert done.stdout == printed.group(1)
