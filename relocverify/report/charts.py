"""Plain SVG charts, written as text: stacked bars per verdict, histograms, and the coverage map.

Every label goes through ``html.escape``; colours and sizes are SVG attributes
(no ``style=``, which the report's Content-Security-Policy forbids)."""

from __future__ import annotations

import math

from ..text import html_text as escape

COLOURS = {"proved": "#2e7d32", "opaque": "#9e9d24", "unknown": "#f9a825", "rejected": "#6d4c41",
           "refuted": "#c62828", "fresh": "#1565c0", "cached": "#90a4ae", "none": "#eeeeee"}
VERDICTS = ("proved", "opaque", "unknown", "rejected", "refuted")


def _svg(width: int, height: int, body: list[str], label: str) -> str:
    return (f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>")


def legend(keys: tuple[str, ...] = VERDICTS) -> str:
    items = "".join(f'<span class="key key-{escape(k)}">{escape(k)}</span>' for k in keys)
    return f'<div class="legend">{items}</div>'


def stacked_bars(rows: list[tuple[str, dict[str, int]]], label: str, keys: tuple[str, ...] = VERDICTS,
                 width: int = 760) -> str:
    """One horizontal bar per row, its length the row's total on a log scale, split by key in proportion."""
    bar_x, bar_w, h = 230, width - 330, 18
    top = max((sum(c.values()) for _, c in rows), default=1) or 1
    body = []
    for i, (name, counts) in enumerate(rows):
        y = i * (h + 4)
        total = sum(counts.get(k, 0) for k in keys)
        length = bar_w * math.log1p(total) / math.log1p(top) if total else 0
        body.append(f'<text x="{bar_x - 6}" y="{y + 13}" text-anchor="end" class="lbl">{escape(name[:34])}</text>')
        x = float(bar_x)
        for k in keys:
            n = counts.get(k, 0)
            if not n:
                continue
            w = length * n / total
            body.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0.5):.1f}" height="{h}" fill="{COLOURS[k]}">'
                        f'<title>{escape(name)}: {n:,} {escape(k)}</title></rect>')
            x += w
        body.append(f'<text x="{x + 6:.1f}" y="{y + 13}" class="num">{total:,}</text>')
    return _svg(width, max(len(rows) * (h + 4), h), body, label)


def histogram(buckets: list[str], series: dict[str, list[int]], label: str, width: int = 760) -> str:
    """Bars per bucket, one colour per series side by side; heights on a log scale (counts differ by 10^4)."""
    plot_h, base = 160, 180
    n = len(buckets)
    slot = (width - 60) / max(n, 1)
    bw = slot / (len(series) + 1)
    top = max((v for vals in series.values() for v in vals), default=1) or 1
    body = [f'<line x1="40" y1="{base}" x2="{width}" y2="{base}" class="axis"/>']
    for i, b in enumerate(buckets):
        x0 = 40 + i * slot
        for j, (name, vals) in enumerate(series.items()):
            v = vals[i]
            hgt = plot_h * math.log1p(v) / math.log1p(top) if v else 0
            body.append(f'<rect x="{x0 + j * bw:.1f}" y="{base - hgt:.1f}" width="{bw:.1f}" height="{hgt:.1f}" '
                        f'fill="{COLOURS.get(name, "#555")}"><title>{escape(b)}: {v:,} {escape(name)}</title></rect>')
        body.append(f'<text x="{x0 + slot / 2:.1f}" y="{base + 14}" text-anchor="middle" class="lbl">'
                    f'{escape(b)}</text>')
    return _svg(width, base + 24, body, label)


#: coverage-map colours by the share of a cell's instructions proved (a refuted one makes the cell red)
SHARE_COLOURS = ((1.0, "#1b5e20", "all proved"), (0.99, "#66bb6a", "≥99% proved"), (0.95, "#c0ca33", "≥95%"),
                 (0.8, "#f9a825", "≥80%"), (0.0, "#6d4c41", "<80%"))


def share_legend() -> str:
    items = [f'<span class="swatch"><svg width="12" height="12"><rect width="12" height="12" fill="{c}"/></svg> '
             f'{escape(label)}</span>' for _, c, label in SHARE_COLOURS]
    items.append(f'<span class="swatch"><svg width="12" height="12"><rect width="12" height="12" '
                 f'fill="{COLOURS["refuted"]}"/></svg> refuted</span>')
    return '<div class="legend">' + " ".join(items) + "</div>"


def _share_colour(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    if not total:
        return COLOURS["none"]
    if counts.get("refuted"):
        return COLOURS["refuted"]
    share = counts.get("proved", 0) / total
    return next(c for limit, c, _ in SHARE_COLOURS if share >= limit)


def coverage_map(cells: list[dict[str, int]], start: int, span: int, section: str, columns: int = 64,
                 size: int = 11) -> str:
    """A grid over ``section``, each cell ``span`` bytes from ``start`` in address order, coloured by the share
    of its instructions proved (``SHARE_COLOURS``; grey: no instructions); the tooltip gives the counts."""
    body = []
    for i, counts in enumerate(cells):
        x, y = (i % columns) * (size + 1), (i // columns) * (size + 1)
        present = [k for k in VERDICTS if counts.get(k)]
        lo = start + i * span
        what = ", ".join(f"{counts[k]:,} {k}" for k in present) or "no instructions"
        body.append(f'<rect x="{x}" y="{y}" width="{size}" height="{size}" fill="{_share_colour(counts)}">'
                    f'<title>{escape(section)} {lo:#x}..{lo + span:#x}: {escape(what)}</title></rect>')
    rows = (len(cells) + columns - 1) // columns
    return _svg(columns * (size + 1), max(rows, 1) * (size + 1), body, f"coverage map of {section}")
