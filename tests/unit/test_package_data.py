"""Every file a package reads at run time ships in its wheel (and so in the container image,
which installs the wheel): each tracked file under outbox/, sender/ and receivers/ that is not
Python matches one of its package's ``package-data`` patterns in pyproject.toml."""

from __future__ import annotations

import fnmatch
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_data_file_of_a_package_is_in_its_package_data():
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    tracked = subprocess.run(["git", "ls-files", "outbox", "sender", "receivers"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    data = [path.split("/", 1) for path in tracked if not path.endswith(".py")]
    assert data, "no data files found: the check would pass vacuously"
    missing = [f"{package}/{rest}" for package, rest in data
               if not any(fnmatch.fnmatch(rest, pattern) for pattern in patterns.get(package, []))]
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"
