"""The overview's charts, measured on the server: where each bar and point goes in an SVG of
``WIDTH`` by ``HEIGHT``, what its tooltip says, and the caption with the totals
(``templates/charts.html`` draws them inline: no script, no external file, readable as text too)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import ClassVar

WIDTH, HEIGHT, LEFT, BOTTOM = 600, 160, 36, 18
#: Where the plot's baseline is: the height less the time axis' labels.
PLOT = HEIGHT - BOTTOM
GREEN, RED, BLUE = "#2da44e", "#cf222e", "#0969da"


@dataclass(frozen=True)
class Mark:
    """A bar (its top left corner and height) or a point of a line (its centre), with its colour and tooltip."""

    x: float
    y: float
    fill: str
    tip: str
    height: float = 0.0


@dataclass(frozen=True)
class Chart:
    """One chart: its bars or its line's points (a line in ``stroke``), the top of its scale and its
    time axis' ends."""

    title: str
    caption: str
    top: float
    first: str  # the first minute as HH:MM ("" without minutes)
    last: str
    bars: list[Mark]
    points: list[Mark]
    line: bool  # the points are joined
    bar_width: float = 0.0
    #: The SVG's size, and where the plot's baseline and left edge are (the template draws the axes there).
    width: ClassVar[int] = WIDTH
    height: ClassVar[int] = HEIGHT
    left: ClassVar[int] = LEFT
    plot: ClassVar[int] = PLOT
    stroke: ClassVar[str] = BLUE


def _scale(values: Sequence[float]) -> float:
    """The chart's top: the largest value, at least 1."""
    return max([1.0, *values])


def _ends(minutes: Sequence[datetime]) -> tuple[str, str]:
    return (f"{minutes[0]:%H:%M}", f"{minutes[-1]:%H:%M}") if minutes else ("", "")


def bars(title: str, minutes: Sequence[datetime], good: Sequence[int], bad: Sequence[int],
         labels: tuple[str, str]) -> Chart:
    """Stacked bars per minute: ``good`` (green) under ``bad`` (red)."""
    top = _scale([g + b for g, b in zip(good, bad, strict=True)])
    step = (WIDTH - LEFT) / max(1, len(minutes))
    marks = []
    for i, (minute, g, b) in enumerate(zip(minutes, good, bad, strict=True)):
        x = LEFT + i * step
        hg, hb = PLOT * g / top, PLOT * b / top
        tip = f"{minute:%H:%M} UTC: {g} {labels[0]}, {b} {labels[1]}"
        if g:
            marks.append(Mark(x, PLOT - hg, GREEN, tip, hg))
        if b:
            marks.append(Mark(x, PLOT - hg - hb, RED, tip, hb))
    caption = f"{sum(good)} {labels[0]}, {sum(bad)} {labels[1]} in {len(minutes)} min"
    return Chart(title, caption, top, *_ends(minutes), bars=marks, points=[], line=False, bar_width=step * 0.8)


def line(title: str, minutes: Sequence[datetime], values: Sequence[int], unit: str) -> Chart:
    """A line (with a dot per minute) of one value over the minutes."""
    top = _scale(values)
    step = (WIDTH - LEFT) / max(1, len(minutes))
    points = [Mark(LEFT + (i + 0.4) * step, PLOT - PLOT * v / top, BLUE, f"{m:%H:%M} UTC: {v} {unit}")
              for i, (m, v) in enumerate(zip(minutes, values, strict=True))]
    caption = f"now {values[-1]} {unit}, at most {max(values)} in {len(minutes)} min" if values else "no data"
    return Chart(title, caption, top, *_ends(minutes), bars=[], points=points, line=True)
