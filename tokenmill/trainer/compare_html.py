"""compare.html: one self-contained page (inline CSS and SVG, no script, no CDN, like
report.html) that shows whether a data recipe helped: the bits-per-byte table with its seed
spread, the loss curves, the cross-evaluation matrix, and each output's funnel side by side."""

from __future__ import annotations

from typing import Any

from tokenmill.page import CSS, esc, funnel_svg, table

COLORS = ["#1f6feb", "#c8553d", "#2f7d4f", "#8250df", "#bf8700", "#0a7b83", "#cf222e", "#57606a"]


def curves_svg(arms: list[dict], width: int = 760, height: int = 300) -> str:
    """Training loss against step: one color per arm, one line per seed."""
    points = [(s, loss) for a in arms for r in a["runs"] for s, loss in r["curve"]]
    if not points:
        return "<p>no loss curve</p>"
    left, bottom = 48, 24
    x_hi = max(s for s, _ in points) or 1
    y_lo, y_hi = min(v for _, v in points), max(v for _, v in points)
    y_hi = y_hi if y_hi > y_lo else y_lo + 1

    def xy(step: float, loss: float) -> str:
        x = left + (width - left - 10) * step / x_hi
        y = 8 + (height - bottom - 8) * (y_hi - loss) / (y_hi - y_lo)
        return f"{x:.1f},{y:.1f}"

    parts = [f'<line x1="{left}" y1="{height - bottom}" x2="{width}" y2="{height - bottom}" stroke="#d0d7de"/>',
             f'<line x1="{left}" y1="0" x2="{left}" y2="{height - bottom}" stroke="#d0d7de"/>',
             f'<text x="0" y="14" font-size="11">{y_hi:.2f}</text>',
             f'<text x="0" y="{height - bottom}" font-size="11">{y_lo:.2f}</text>',
             f'<text x="{width}" y="{height - 6}" font-size="11" text-anchor="end">step {x_hi:,.0f}</text>']
    for i, a in enumerate(arms):
        color = COLORS[i % len(COLORS)]
        for r in a["runs"]:
            pts = " ".join(xy(s, v) for s, v in r["curve"])
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" stroke-opacity="0.85" '
                         f'points="{pts}"><title>{esc(a["name"])} seed {r["seed"]}</title></polyline>')
    legend = "".join(f'<span style="background:{COLORS[i % len(COLORS)]}"></span>{esc(a["name"])}'
                     for i, a in enumerate(arms))
    return (f'<svg width="{width}" height="{height}" role="img">' + "".join(parts) + "</svg>"
            f'<p class="legend">{legend}</p>')


def _bpb(v: float | None) -> str:
    return "" if v is None else f"{v:.4f}"


def render(result: dict[str, Any]) -> str:
    arms = result["arms"]
    seeds = result["seeds"]
    out = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>tokenmill compare</title>"
           f"<style>{CSS}</style></head><body><header><h1>tokenmill compare</h1>"
           f"<p>tokenmill {esc(result['tokenmill_version'])} &middot; {len(arms)} arms &middot; "
           f"{result['tokens_per_arm']:,} training tokens each &middot; {len(seeds)} seed(s) &middot; "
           f"eval: {esc(result['eval']['path'])} ({result['eval']['docs']:,} docs, "
           f"{result['eval']['bytes']:,} bytes)</p></header><main>"]

    rows = []
    best = min(a["eval_bpb"]["mean"] for a in arms)
    for a in arms:
        b = a["eval_bpb"]
        mean = f"{b['mean']:.4f}" + (" (best)" if b["mean"] == best else "")
        rows.append([esc(a["name"]), mean, f"{b['min']:.4f} \u2013 {b['max']:.4f}",
                     " ".join(f"{r['eval_bpb']:.4f}" for r in a["runs"]), f"{a['tokenizer']['vocab_size']:,}",
                     f"{a['train_tokens']:,}", f"{a['corpus_tokens']:,}"])
    out.append("<section><h2>Bits per byte on the evaluation text (lower is better)</h2>"
               + table(["arm", "mean", "seed range", "per seed", "vocab", "tokens trained", "tokens in corpus"],
                       rows, numeric={1, 2, 3, 4, 5, 6}))
    lines = []
    for v in result["verdicts"]:
        if v["exceeds_spread"] is None:
            said = '<span class="bad">unknown: one seed gives no spread</span>'
        elif v["exceeds_spread"]:
            said = '<span class="ok">beyond the seed spread</span>'
        else:
            said = '<span class="bad">within the seed spread: not a real difference yet</span>'
        lines.append(f"<li>{esc(v['best'])} beats {esc(v['arm'])} by {v['gap_bpb']:.4f} bpb: {said}</li>")
    out.append(f"<ul>{''.join(lines)}</ul></section>")

    out.append(f"<section><h2>Training loss</h2>{curves_svg(arms)}</section>")

    m = result["val_matrix"]
    mrows = [[esc(name)] + [_bpb(v) for v in row] for name, row in zip(m["models"], m["bpb"])]
    out.append("<section><h2>Each arm on every arm's validation split (bpb, mean over seeds)</h2>"
               "<p>Rows: the model trained on that arm; columns: the validation split it is scored on.</p>"
               + table(["model \\ val split", *m["val_splits"]], mrows, numeric=set(range(1, len(m["val_splits"]) + 1)))
               + "</section>")

    cols = []
    for a in arms:
        rep = a["report"]
        if not rep:
            cols.append(f"<div><h3>{esc(a['name'])}</h3><p>no report.json</p></div>")
            continue
        drops = table(["reason", "docs"], [[esc(r), f"{n:,}"] for r, n in rep.get("top_drops", [])], numeric={1})
        d = rep.get("documents") or {}
        cols.append(f"<div><h3>{esc(a['name'])}</h3><p>{d.get('read', 0):,} read, {d.get('kept', 0):,} kept, "
                    f"{rep.get('tokens_kept') or 0:,} tokens</p>"
                    f"<div style=\"overflow-x:auto\">{funnel_svg(rep.get('funnel') or [])}</div>"
                    f"<h3>top drop reasons</h3>{drops}</div>")
    out.append(f"<section><h2>What each recipe kept</h2><div class=\"grid\">{''.join(cols)}</div></section>")
    out.append("</main></body></html>")
    return "".join(out)
