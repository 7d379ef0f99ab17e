"""report.html: one self-contained page (inline CSS and SVG, no script, no CDN) that a person
opens offline to see what the pipeline kept, what it threw away, and why."""

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


def render(report: dict[str, Any], samples: dict[str, list[dict]], per_reason: int = 3) -> str:
    d = report["documents"]
    out = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>tokenmill report</title>"
           f"<style>{CSS}</style></head><body><header><h1>tokenmill report</h1>"
           f"<p>tokenmill {esc(report.get('tokenmill_version', ''))} &middot; inputs: "
           f"{esc(', '.join(report.get('config', {}).get('inputs', [])))}</p></header><main>"]
    cards = [("documents read", f"{d['read']:,}"), ("kept", f"{d['kept']:,}"), ("dropped", f"{d['dropped']:,}"),
             ("characters kept", f"{report.get('chars_kept', 0):,}")]
    if report.get("tokens_kept"):
        cards.append(("tokens kept", f"{report['tokens_kept']:,}"))
    out.append('<div class="cards">' + "".join(f'<div class="card">{esc(k)}<b>{v}</b></div>' for k, v in cards)
               + "</div>")
    out.append(f'<section id="funnel"><h2>Funnel</h2><p class="legend"><span style="background:{KEPT}"></span>kept'
               f'<span style="background:{DROPPED}"></span>dropped at this stage</p>{funnel_svg(report["funnel"])}'
               "</section>")
    reasons = list(report["dropped_by"].items())
    out.append('<section id="reasons"><h2>Drop reasons</h2>'
               + bar_rows(reasons, d["read"], DROPPED) + "</section>")
    skipped = report.get("inputs_skipped") or {}
    if skipped:  # found at launch but not read: no row in OUT/docs, so said here
        out.append('<section id="skipped"><h2>Inputs not read</h2>'
                   + bar_rows(list(skipped.items()), 0, DROPPED) + "</section>")
    out.append('<section id="languages"><h2>Languages kept</h2>'
               + bar_rows(list(report["languages"].items())[:25], d["kept"], KEPT) + "</section>")
    if report.get("languages_dropped"):
        rows = [[esc(lang), report["languages"].get(lang, 0), sum(r.values()),
                 esc(", ".join(f"{k} {v:,}" for k, v in list(r.items())[:4]))]
                for lang, r in list(report["languages_dropped"].items())[:25]]
        out.append('<section id="languages_dropped"><h2>Kept and dropped per language</h2>'
                   + table(["language", "kept", "dropped", "top reasons"], rows, {1, 2}) + "</section>")
    if report.get("histograms"):
        out.append(f'<section id="signals"><h2>Signals: kept vs dropped</h2><p class="legend">'
                   f'<span style="background:{KEPT}"></span>kept<span style="background:{DROPPED}"></span>dropped</p>'
                   '<div class="grid">' + "".join(hist_svg(n, h) for n, h in report["histograms"].items())
                   + "</div></section>")
    if report.get("corpus_metrics"):
        rows = [[esc(m["metric"]), m["value"], esc(m["target"]),
                 '<span class="ok">ok</span>' if m["ok"] else '<span class="bad">off target</span>']
                for m in report["corpus_metrics"]]
        out.append('<section id="metrics"><h2>Corpus metrics vs targets</h2>'
                   + table(["metric", "value", "target", ""], rows, {1}) + "</section>")
    if report.get("pii_redactions"):
        out.append('<section id="pii"><h2>PII redacted</h2>'
                   + bar_rows(list(report["pii_redactions"].items()), 0, "#6f42c1") + "</section>")
    if report.get("decontamination"):
        out.append('<section id="decontamination"><h2>Evaluation overlap (documents per file)</h2>'
                   + bar_rows(list(report["decontamination"].items()), 0, "#bf3989") + "</section>")
    dedup = report.get("dedup")
    if dedup:
        rows = [[esc(c["cluster"]), c["size"], esc(", ".join(c["member_ids"]))] for c in dedup.get("largest", [])[:10]]
        out.append(f'<section id="dedup"><h2>Duplicates</h2><p>{dedup["clusters"]:,} clusters with '
                   f'{dedup["members"]:,} documents; removed {dedup["removed_exact"]:,} exact and '
                   f'{dedup["removed_near"]:,} near duplicates.</p>'
                   + bar_rows(list(dedup.get("size_histogram", {}).items()), 0, "#0969da")
                   + "<h3>Largest clusters</h3>" + table(["survivor", "size", "members"], rows, {1}) + "</section>")
    if samples:
        parts = ['<section id="samples"><h2>Dropped documents, by reason</h2>']
        for reason in sorted(samples):
            parts.append(f"<h3>{esc(reason)} <small>({report['dropped_by'].get(reason, 0):,})</small></h3>")
            for smp in samples[reason][:per_reason]:
                sig = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in smp.get("signals", {}).items())
                parts.append(f"<details><summary><code>{esc(smp['id'])}</code> {esc(smp.get('url') or '')}</summary>"
                             f"<p>{esc(sig) or 'no signals'}</p><pre>{esc(smp.get('text') or '(no text)')}</pre>"
                             "</details>")
        out.append("".join(parts) + "</section>")
    out.append("</main></body></html>")
    return "\n".join(out)
