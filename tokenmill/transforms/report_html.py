"""report.html: one self-contained page (inline CSS and SVG, no script, no CDN) that a person
opens offline to see what the pipeline kept, what it threw away, and why."""

from __future__ import annotations

from typing import Any

from tokenmill.page import CSS, DROPPED, KEPT, bar_rows, esc, funnel_svg, hist_svg, table


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
