"""Charts drawn on the server as inline SVG: no script, no external file, readable as text too
(every bar and point carries a ``<title>``, every chart a caption with its totals)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from html import escape

WIDTH, HEIGHT, LEFT, BOTTOM = 600, 160, 36, 18
GREEN, RED, BLUE = "#2da44e", "#cf222e", "#0969da"


def _frame(title: str, top: float, minutes: Sequence[datetime], shapes: str, caption: str) -> str:
    plot = HEIGHT - BOTTOM
    axis = (f"<line x1='{LEFT}' y1='{plot}' x2='{WIDTH}' y2='{plot}' stroke='#8c959f'/>"
            f"<text x='{LEFT - 4}' y='10' text-anchor='end' font-size='10'>{top:g}</text>"
            f"<text x='{LEFT - 4}' y='{plot}' text-anchor='end' font-size='10'>0</text>")
    if minutes:
        axis += (f"<text x='{LEFT}' y='{HEIGHT - 4}' font-size='10'>{minutes[0]:%H:%M}</text>"
                 f"<text x='{WIDTH}' y='{HEIGHT - 4}' text-anchor='end' font-size='10'>{minutes[-1]:%H:%M} UTC</text>")
    return (f"<figure><svg viewBox='0 0 {WIDTH} {HEIGHT}' role='img' aria-label='{escape(title)}'>"
            f"<title>{escape(title)}</title>{axis}{shapes}</svg>"
            f"<figcaption><b>{escape(title)}</b> · {escape(caption)}</figcaption></figure>")


def _scale(values: Sequence[float]) -> float:
    """The chart's top: the largest value, at least 1."""
    return max([1.0, *values])


def bars(title: str, minutes: Sequence[datetime], good: Sequence[int], bad: Sequence[int],
         labels: tuple[str, str]) -> str:
    """Stacked bars per minute: ``good`` (green) under ``bad`` (red)."""
    top = _scale([g + b for g, b in zip(good, bad, strict=True)])
    plot = HEIGHT - BOTTOM
    step = (WIDTH - LEFT) / max(1, len(minutes))
    shapes = []
    for i, (minute, g, b) in enumerate(zip(minutes, good, bad, strict=True)):
        x = LEFT + i * step
        hg, hb = plot * g / top, plot * b / top
        tip = f"<title>{minute:%H:%M} UTC: {g} {labels[0]}, {b} {labels[1]}</title>"
        if g:
            shapes.append(f"<rect x='{x:.1f}' y='{plot - hg:.1f}' width='{step * 0.8:.1f}' height='{hg:.1f}' "
                          f"fill='{GREEN}'>{tip}</rect>")
        if b:
            shapes.append(f"<rect x='{x:.1f}' y='{plot - hg - hb:.1f}' width='{step * 0.8:.1f}' "
                          f"height='{hb:.1f}' fill='{RED}'>{tip}</rect>")
    caption = f"{sum(good)} {labels[0]}, {sum(bad)} {labels[1]} in {len(minutes)} min"
    return _frame(title, top, minutes, "".join(shapes), caption)


def line(title: str, minutes: Sequence[datetime], values: Sequence[int], unit: str) -> str:
    """A line (with a dot per minute) of one value over the minutes."""
    top = _scale(values)
    plot = HEIGHT - BOTTOM
    step = (WIDTH - LEFT) / max(1, len(minutes))
    points = [(LEFT + (i + 0.4) * step, plot - plot * v / top) for i, v in enumerate(values)]
    path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    dots = "".join(f"<circle cx='{x:.1f}' cy='{y:.1f}' r='2' fill='{BLUE}'><title>{m:%H:%M} UTC: {v} {unit}"
                   f"</title></circle>" for (x, y), m, v in zip(points, minutes, values, strict=True))
    shapes = f"<polyline points='{path}' fill='none' stroke='{BLUE}' stroke-width='1.5'/>{dots}"
    caption = (f"now {values[-1]} {unit}, at most {max(values)} in {len(minutes)} min" if values else "no data")
    return _frame(title, top, minutes, shapes, caption)
