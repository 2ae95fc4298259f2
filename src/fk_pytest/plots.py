"""Inline SVG charts for the HTML report: no plotting library, no external files.

Speedups are drawn on a log2 axis centred on 1x (a 2x win and a 2x loss are the same length);
shares (C_t, credit) on a linear 0..1 axis. Bars of invalid entries are grey: their number is shown
but does not count.
"""
import html
import math
from typing import Iterable, Optional, Tuple

BAR_H, GAP, LABEL_W, PLOT_W, VALUE_W = 16, 4, 260, 360, 70
GOOD, BAD, MUTED = "#2a7d2a", "#b03030", "#999999"


def _frame(rows: int, body: str, axis: str) -> str:
    height = rows * (BAR_H + GAP) + 24
    width = LABEL_W + PLOT_W + VALUE_W
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
            f"font-family='sans-serif' font-size='11'>{axis}{body}</svg>")


def _label(i: int, text: str) -> str:
    y = i * (BAR_H + GAP) + BAR_H - 4
    return f"<text x='{LABEL_W - 6}' y='{y}' text-anchor='end'>{html.escape(text[:44])}</text>"


def speedup_chart(items: Iterable[Tuple[str, Optional[float], bool]], span: float = 4.0) -> str:
    """Horizontal bars from 1x to each speedup (log2 axis from 1/span to span); None: no bar."""
    items = list(items)
    if not items:
        return ""
    half, centre = PLOT_W / 2, LABEL_W + PLOT_W / 2
    scale = half / math.log2(span)
    parts = []
    for i, (label, value, valid) in enumerate(items):
        parts.append(_label(i, label))
        y = i * (BAR_H + GAP)
        if value is None or value <= 0:
            parts.append(f"<text x='{centre + 4}' y='{y + BAR_H - 4}' fill='{MUTED}'>not timed</text>")
            continue
        x = max(-half, min(half, math.log2(value) * scale))
        colour = MUTED if not valid else (GOOD if value >= 1 else BAD)
        parts.append(f"<rect x='{centre + min(0, x):.1f}' y='{y}' width='{abs(x):.1f}' height='{BAR_H}' "
                     f"fill='{colour}'><title>{html.escape(label)}: {value:.3f}x</title></rect>")
        parts.append(f"<text x='{LABEL_W + PLOT_W + 6}' y='{y + BAR_H - 4}'>{value:.3f}x</text>")
    bottom = len(items) * (BAR_H + GAP) + 14
    axis = (f"<line x1='{centre}' y1='0' x2='{centre}' y2='{bottom - 10}' stroke='#333'/>"
            f"<text x='{LABEL_W}' y='{bottom}'>{1 / span:g}x</text>"
            f"<text x='{centre}' y='{bottom}' text-anchor='middle'>1x</text>"
            f"<text x='{LABEL_W + PLOT_W}' y='{bottom}' text-anchor='end'>{span:g}x</text>")
    return _frame(len(items), "".join(parts), axis)


def share_chart(items: Iterable[Tuple[str, float, bool]]) -> str:
    """Horizontal bars of values in [0, 1] (share of cases passed, credit)."""
    return value_chart(((label, value, GOOD if valid else BAD) for label, value, valid in items), top=1.0,
                       digits=2)


def value_chart(items: Iterable[Tuple[str, Optional[float], str]], top: Optional[float] = None,
                digits: int = 3) -> str:
    """Horizontal bars on a linear axis from 0 to ``top`` (default: the largest value, at least 1),
    each in its own colour; a value of None is written as "not measured" without a bar."""
    items = list(items)
    if not items:
        return ""
    top = top or max([1.0] + [v for _, v, _ in items if v is not None])
    parts = []
    for i, (label, value, colour) in enumerate(items):
        y = i * (BAR_H + GAP)
        parts.append(_label(i, label))
        if value is None:
            parts.append(f"<text x='{LABEL_W + 4}' y='{y + BAR_H - 4}' fill='{MUTED}'>not measured</text>")
            continue
        width = max(0.0, min(1.0, value / top)) * PLOT_W
        parts.append(f"<rect x='{LABEL_W}' y='{y}' width='{width:.1f}' height='{BAR_H}' "
                     f"fill='{colour}'><title>{html.escape(label)}: {value:.{digits}f}</title></rect>")
        parts.append(f"<text x='{LABEL_W + PLOT_W + 6}' y='{y + BAR_H - 4}'>{value:.{digits}f}</text>")
    bottom = len(items) * (BAR_H + GAP) + 14
    axis = (f"<line x1='{LABEL_W}' y1='0' x2='{LABEL_W}' y2='{bottom - 10}' stroke='#333'/>"
            f"<text x='{LABEL_W}' y='{bottom}'>0</text>"
            f"<text x='{LABEL_W + PLOT_W}' y='{bottom}' text-anchor='end'>{top:g}</text>")
    return _frame(len(items), "".join(parts), axis)
