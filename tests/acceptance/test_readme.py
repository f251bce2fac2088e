"""The README's Python examples run as printed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_python_examples():
    assert python_blocks()


def test_every_python_example_runs(tmp_path: Path):
    for number, code in enumerate(python_blocks()):
        script = tmp_path / f"example_{number}.py"
        script.write_text(code)
        for _ in range(2):  # and again: the examples are safe to re-run (idempotent enqueue)
            done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=60)
            assert done.returncode == 0, done.stderr
    assert (tmp_path / "shop.db").exists()
    assert done.stdout.startswith("False pending sha256:")
