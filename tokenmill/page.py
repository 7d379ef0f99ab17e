"""Self-contained HTML pages (inline CSS and SVG, no script, no CDN): the style and the small
widgets that the run report (transforms/report_html.py) and `tokenmill compare` share."""

from __future__ import annotations

import html
from typing import Any

KEPT, DROPPED = "#2f7d4f", "#c8553d"
CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d232a;background:#f6f7f9}
header{background:#1d232a;color:#fff;padding:18px 32px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#c9d1d9}main{padding:16px 32px;max-width:1200px}
section{background:#fff;border:1px solid #e1e4e8;border-radius:8px;padding:16px 20px;margin:16px 0}
h2{margin:0 0 12px;font-size:17px}table{border-collapse:collapse;width:100%}
td,th{padding:4px 8px;border-bottom:1px solid #eef0f2;text-align:left;vertical-align:top}
th{color:#57606a;font-weight:600}td.n{text-align:right;font-variant-numeric:tabular-nums}
.cards{display:flex;gap:12px;flex-wrap:wrap}.card{flex:1;min-width:150px;background:#fff;border:1px solid #e1e4e8;
border-radius:8px;padding:12px 16px}.card b{display:block;font-size:24px}.grid{display:grid;
grid-template-columns:repeat(auto-fill,minmax(340px,1fr));gap:12px}.hist h3{font-size:13px;margin:0 0 4px}
.legend span{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px}
details{border-top:1px solid #eef0f2;padding:6px 0}summary{cursor:pointer}
pre{white-space:pre-wrap;background:#f6f8fa;padding:8px;border-radius:6px;max-height:220px;overflow:auto}
.ok{color:#2f7d4f;font-weight:600}.bad{color:#c8553d;font-weight:600}code{font-size:12px}
"""


def esc(x: Any) -> str:
    return html.escape(str(x))


def bar_rows(items: list[tuple[str, int]], total: int, color: str, width: int = 420) -> str:
    """Horizontal bars as one SVG: label, bar, count."""
    if not items:
        return "<p>none</p>"
    h, top = 22, max(v for _, v in items) or 1
    rows = []
    for i, (label, v) in enumerate(items):
        w = max(1, int(v / top * width))
        y = i * h
        pct = f" ({v / total:.1%})" if total else ""
        rows.append(f'<text x="0" y="{y + 15}" font-size="12">{esc(label)}</text>'
                    f'<rect x="200" y="{y + 4}" width="{w}" height="14" fill="{color}"/>'
                    f'<text x="{206 + w}" y="{y + 15}" font-size="12">{v:,}{pct}</text>')
    return (f'<svg width="{width + 320}" height="{len(items) * h}" role="img">' + "".join(rows) + "</svg>")


def funnel_svg(funnel: list[dict]) -> str:
    if not funnel:
        return ""
    width, h = 560, 30
    top = funnel[0]["in"] or 1
    parts = []
    for i, row in enumerate(funnel):
        y = i * h
        wk = int(row["out"] / top * width)
        wd = int(row["dropped"] / top * width)
        parts.append(f'<text x="0" y="{y + 19}" font-size="13">{esc(row["stage"])}</text>'
                     f'<rect x="90" y="{y + 5}" width="{max(wk, 1)}" height="20" fill="{KEPT}"/>'
                     f'<rect x="{90 + wk}" y="{y + 5}" width="{wd}" height="20" fill="{DROPPED}"/>'
                     f'<text x="{96 + wk + wd}" y="{y + 19}" font-size="12">{row["out"]:,} kept, '
                     f'{row["dropped"]:,} dropped</text>')
    return f'<svg width="{width + 300}" height="{len(funnel) * h}" role="img">' + "".join(parts) + "</svg>"


def hist_svg(name: str, h: dict) -> str:
    kept, dropped = h["kept"], h["dropped"]
    n = len(kept)
    width, height = 320, 120
    top = max(max(kept), max(dropped), 1)
    bw = width / n
    parts = []
    for i in range(n):
        for j, (vals, color) in enumerate(((kept, KEPT), (dropped, DROPPED))):
            bh = vals[i] / top * (height - 20)
            parts.append(f'<rect x="{i * bw + j * bw / 2:.1f}" y="{height - 16 - bh:.1f}" width="{bw / 2:.1f}" '
                         f'height="{bh:.1f}" fill="{color}"><title>{vals[i]}</title></rect>')
    lo, hi = h["low"], h["high"]
    fmt = (lambda v: f"{10 ** v - 1:,.0f}") if h.get("log10") else (lambda v: f"{v:g}")
    parts.append(f'<text x="0" y="{height - 2}" font-size="10">{fmt(lo)}</text>'
                 f'<text x="{width}" y="{height - 2}" font-size="10" text-anchor="end">{fmt(hi)}</text>')
    return (f'<div class="hist"><h3>{esc(name)}{" (log scale)" if h.get("log10") else ""}</h3>'
            f'<svg width="{width}" height="{height}" role="img">' + "".join(parts) + "</svg></div>")


def table(headers: list[str], rows: list[list[Any]], numeric: set[int] = frozenset()) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f'<td class="n">{esc(c)}</td>' if i in numeric else f"<td>{c}</td>"
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
