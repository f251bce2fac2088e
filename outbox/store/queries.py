"""Named SQL blocks, one file per dialect (``sql/<dialect>.sql``)."""

from __future__ import annotations

import re
from functools import cache
from importlib.resources import files

_BLOCK = re.compile(r"^-- name: (\w+)\n-- [^\n]*\n(.*?)(?=^-- name: |\Z)", re.M | re.S)


@cache
def load(dialect: str, package: str = __package__) -> dict[str, str]:
    """Every named statement of a dialect in ``package``'s ``sql/<dialect>.sql``, by name."""
    text = files(package).joinpath(f"sql/{dialect}.sql").read_text()
    blocks = {name: body.strip() for name, body in _BLOCK.findall(text)}
    if not blocks:
        raise RuntimeError(f"no named SQL blocks in sql/{dialect}.sql")
    return blocks
