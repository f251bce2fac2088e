"""Named SQL blocks, one file per dialect (``sql/<dialect>.sql`` in a package), each statement
``-- name: NAME`` then a line saying what it does. A public part of ``receivers`` (the leaf
package): the receivers' record stores and the outbox's store both keep their statements this way."""

from __future__ import annotations

import re
from functools import cache

_BLOCK = re.compile(r"^-- name: (\w+)\n-- [^\n]*\n(.*?)(?=^-- name: |\Z)", re.M | re.S)


class Queries:
    """The named SQL blocks of one package's ``sql/<dialect>.sql`` files."""

    def __init__(self, package: str) -> None:
        self.package = package

    def load(self, dialect: str) -> dict[str, str]:
        """Every named statement of a dialect, by name (the file is read once)."""
        return _load(self.package, dialect)


@cache
def _load(package: str, dialect: str) -> dict[str, str]:
    from importlib.resources import files  # only once a store is made, not with `import receivers`

    text = files(package).joinpath(f"sql/{dialect}.sql").read_text()
    blocks = {name: body.strip() for name, body in _BLOCK.findall(text)}
    if not blocks:
        raise RuntimeError(f"no named SQL blocks in sql/{dialect}.sql")
    return blocks
