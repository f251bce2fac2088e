"""The repository stands on its own: what its files rely on is said in them or in the README."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Directories that hold no file of the repository's own (tools' caches, environments, builds).
NOT_OURS = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist"}


def repository_files() -> Iterator[Path]:
    """Every text file of the repository, its hidden directories (caches) aside, ``.ci`` included."""
    for directory, subdirectories, names in os.walk(ROOT):
        subdirectories[:] = [d for d in subdirectories if d not in NOT_OURS and not d.endswith(".egg-info")
                             and (not d.startswith(".") or d == ".ci")]
        for name in names:
            path = Path(directory, name)
            if b"\0" not in path.read_bytes()[:8192]:
                yield path


def test_no_file_cites_a_design_document_outside_the_repository():
    cited = "DESIGN.md"
    found = [str(path.relative_to(ROOT)) for path in repository_files()
             if path != Path(__file__).resolve() and cited.lower() in path.read_text(errors="replace").lower()]
    assert not found, f"{', '.join(found)} cite {cited}, which is not in the repository: say what the code " \
                      "relies on where it relies on it, or point at the README section that says it"
