"""The run report: counts per stage and reason, languages, sample dropped documents.

The counts are computed inside the pipeline by a CombineFn over the final documents (not
read back from runner metrics), so report.json is exact on every runner and is written by
a worker through FileSystems. The accumulator is a plain dict: pure functions below build,
merge and finish it; ``ReportFn`` only wires them into Beam.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

import apache_beam as beam
import numpy as np

from tokenmill.beamfs import FileSystems
from tokenmill.transforms.stages import ORDER as STAGES
from tokenmill.transforms.stages import REPORT_COLUMNS

SAMPLE_CHARS = 600
# Exact duplicate ratio needs every survivor's 8-byte text hash; past this many it is not computed.
MAX_HASHES = 2_000_000
HASH_BYTES = 8

# What the stages' specs ask the report to show: kept-vs-dropped histograms (low, high, bins,
# log10 scale) and the values shown with each sample document.
HISTOGRAMS = {name: spec for name, spec in REPORT_COLUMNS.items() if spec is not None}
SAMPLE_SIGNALS = list(REPORT_COLUMNS)


def bin_of(value: float, spec: tuple) -> int:
    lo, hi, n, log = spec
    x = math.log10(max(value, 0) + 1) if log else value
    return min(n - 1, max(0, int((x - lo) / (hi - lo) * n)))


def new_acc() -> dict[str, Any]:
    return {"docs": 0, "kept": 0, "chars_kept": 0, "tokens_kept": 0, "words_kept": 0, "entropy_sum": 0.0, "unk_kept": 0,
            # 8-byte text hashes of kept docs, concatenated: 8 bytes each instead of ~49 as a list
            # of bytes objects, in every worker's accumulator and in the merge.
            "text_hashes": bytearray(),
            "dropped": {}, "langs": {}, "samples": {}, "pii": {}, "hist": {}, "decont": {}, "lang_drops": {},
            "boilerplate": {"docs": 0, "lines": 0, "chars": 0}}


def _sample(doc: dict[str, Any]) -> dict[str, Any]:
    out = {"id": doc.get("id"), "url": doc.get("url"), "source": doc.get("source")}
    out["signals"] = {k: doc[k] for k in SAMPLE_SIGNALS if doc.get(k) is not None}
    out["text"] = (doc.get("text") or "")[:SAMPLE_CHARS]
    return out


def _keep_samples(samples: list[dict], n: int) -> list[dict]:
    # The n smallest ids: deterministic whatever order the runner delivers documents in.
    return sorted(samples, key=lambda s: str(s["id"]))[:n]


def add_doc(acc: dict[str, Any], doc: dict[str, Any], n_samples: int) -> dict[str, Any]:
    acc["docs"] += 1
    reason = doc.get("dropped_by")
    for kind, n in (doc.get("pii") or {}).items():
        acc["pii"][kind] = acc["pii"].get(kind, 0) + n
    if doc.get("boilerplate_lines"):  # lines cut as repeated across documents
        b = acc["boilerplate"]
        b["docs"], b["lines"], b["chars"] = b["docs"] + 1, b["lines"] + doc["boilerplate_lines"], b["chars"] + doc["boilerplate_chars"]
    for name in doc.get("decontaminated") or ():  # the evaluation files it overlapped
        acc["decont"][name] = acc["decont"].get(name, 0) + 1
    side = "dropped" if reason else "kept"
    for name, spec in HISTOGRAMS.items():
        value = doc.get(name)
        if value is not None:
            h = acc["hist"].setdefault(name, {"kept": [0] * spec[2], "dropped": [0] * spec[2]})
            h[side][bin_of(float(value), spec)] += 1
    if reason:
        acc["dropped"][reason] = acc["dropped"].get(reason, 0) + 1
        if doc.get("lang"):  # past language ID: per language and reason (quality.per_lang tunes these)
            by_reason = acc["lang_drops"].setdefault(doc["lang"], {})
            by_reason[reason] = by_reason.get(reason, 0) + 1
        if n_samples:
            bucket = acc["samples"].setdefault(reason, [])
            bucket.append(_sample(doc))
            if len(bucket) > 2 * n_samples:
                acc["samples"][reason] = _keep_samples(bucket, n_samples)
    else:
        acc["kept"] += 1
        acc["chars_kept"] += len(doc.get("text") or "")
        acc["tokens_kept"] += doc.get("n_tokens") or 0
        acc["words_kept"] += doc.get("n_words") or 0
        acc["entropy_sum"] += doc.get("char_entropy") or 0.0
        acc["unk_kept"] += doc.get("n_unk") or 0
        if acc["text_hashes"] is not None:
            acc["text_hashes"] += text_hash(doc.get("text") or "")
            if len(acc["text_hashes"]) > MAX_HASHES * HASH_BYTES:
                acc["text_hashes"] = None
        lang = doc.get("lang") or "und"
        acc["langs"][lang] = acc["langs"].get(lang, 0) + 1
    return acc


def merge(accs: list[dict[str, Any]], n_samples: int) -> dict[str, Any]:
    out = new_acc()
    for a in accs:
        out["docs"] += a["docs"]
        out["kept"] += a["kept"]
        out["chars_kept"] += a["chars_kept"]
        out["tokens_kept"] += a["tokens_kept"]
        out["words_kept"] += a["words_kept"]
        out["entropy_sum"] += a["entropy_sum"]
        out["unk_kept"] += a["unk_kept"]
        if out["text_hashes"] is not None and a["text_hashes"] is not None:
            out["text_hashes"] += a["text_hashes"]
            if len(out["text_hashes"]) > MAX_HASHES * HASH_BYTES:
                out["text_hashes"] = None
        else:
            out["text_hashes"] = None
        for key in ("dropped", "langs", "pii", "decont"):
            for k, v in a[key].items():
                out[key][k] = out[key].get(k, 0) + v
        for k in ("docs", "lines", "chars"):
            out["boilerplate"][k] += a["boilerplate"][k]
        for lang, reasons in a["lang_drops"].items():
            mine = out["lang_drops"].setdefault(lang, {})
            for r, n in reasons.items():
                mine[r] = mine.get(r, 0) + n
        for name, h in a["hist"].items():
            mine = out["hist"].setdefault(name, {"kept": [0] * len(h["kept"]), "dropped": [0] * len(h["kept"])})
            for side in ("kept", "dropped"):
                mine[side] = [x + y for x, y in zip(mine[side], h[side])]
        for reason, samples in a["samples"].items():
            out["samples"][reason] = _keep_samples(out["samples"].get(reason, []) + samples, n_samples)
    return out


def funnel(dropped: dict[str, int], total: int, stages: list[str]) -> list[dict[str, Any]]:
    """Documents into and out of each stage that ran, with the drops per reason, in pipeline order."""
    rows, remaining = [], total
    stages = [s for s in STAGES if s in stages or any(r.startswith(s + ":") for r in dropped)]
    for stage in stages:
        reasons = {r.split(":", 1)[1]: n for r, n in dropped.items() if r.split(":", 1)[0] == stage}
        n_drop = sum(reasons.values())
        rows.append({"stage": stage, "in": remaining, "dropped": n_drop, "out": remaining - n_drop,
                     "reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1]))})
        remaining -= n_drop
    return rows


def finish(acc: dict[str, Any], stages: list[str], extra: dict[str, Any] | None = None) -> dict[str, Any]:
    dropped = dict(sorted(acc["dropped"].items(), key=lambda kv: (-kv[1], kv[0])))
    report = {
        "documents": {"read": acc["docs"], "kept": acc["kept"], "dropped": acc["docs"] - acc["kept"]},
        "chars_kept": acc["chars_kept"],
        "tokens_kept": acc["tokens_kept"],
        "funnel": funnel(dropped, acc["docs"], stages),
        "dropped_by": dropped,
        "languages": dict(sorted(acc["langs"].items(), key=lambda kv: (-kv[1], kv[0]))),
        "languages_dropped": {lang: dict(sorted(r.items(), key=lambda kv: (-kv[1], kv[0]))) for lang, r in
                              sorted(acc["lang_drops"].items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))},
        "samples": {r: len(s) for r, s in sorted(acc["samples"].items())},
        "pii_redactions": dict(sorted(acc["pii"].items())),
        "boilerplate_cut": acc["boilerplate"],
        "decontamination": dict(sorted(acc["decont"].items(), key=lambda kv: (-kv[1], kv[0]))),
        "histograms": {name: {"low": HISTOGRAMS[name][0], "high": HISTOGRAMS[name][1], "log10": HISTOGRAMS[name][3],
                              **h} for name, h in acc["hist"].items()},
        "corpus_metrics": corpus_metrics(acc),
    }
    report.update(extra or {})
    return report


def text_hash(text: str) -> bytes:
    return hashlib.blake2b(" ".join(text.lower().split()).encode("utf-8"), digest_size=HASH_BYTES).digest()


def corpus_metrics(acc: dict[str, Any]) -> list[dict[str, Any]]:
    """The seed recipes' corpus metrics over survivors, each with its target."""
    kept = acc["kept"] or 1
    rows = []
    if acc["text_hashes"] is not None and acc["kept"]:
        hashes = np.frombuffer(acc["text_hashes"], dtype=np.uint64)
        ratio = 1 - len(np.unique(hashes)) / len(hashes)
        rows.append({"metric": "duplicate-text ratio (exact, normalised)", "value": round(ratio, 5),
                     "target": "< 0.005", "ok": ratio < 0.005})
    if acc["tokens_kept"]:
        cov = 1 - acc["unk_kept"] / acc["tokens_kept"]
        rows.append({"metric": "tokenizer vocabulary coverage (tokens not <unk>)", "value": round(cov, 5),
                     "target": ">= 0.98", "ok": cov >= 0.98})
    if acc["words_kept"]:
        rows.append({"metric": "character entropy (bits/char, mean over docs)", "value": round(acc["entropy_sum"] / kept, 3),
                     "target": "3.5 - 5.5 for alphabetic scripts", "ok": 3.5 <= acc["entropy_sum"] / kept <= 5.5})
    if acc["words_kept"] and acc["tokens_kept"]:
        fert = acc["tokens_kept"] / acc["words_kept"]
        rows.append({"metric": "token fertility (tokens per word)", "value": round(fert, 3),
                     "target": "<= 2.0", "ok": fert <= 2.0})
    return rows


def sample_file_name(reason: str) -> str:
    return reason.replace(":", "-").replace("/", "_") + ".jsonl"


def write_report(acc: dict[str, Any], report_dir: str, stages: list[str], extra: dict[str, Any] | None = None,
                 dedup: dict[str, Any] | None = None) -> str:
    """Write report.json, report.html and samples/<reason>.jsonl under ``report_dir``."""
    report = finish(acc, stages, {**(extra or {}), **({"dedup": dedup} if dedup else {})})
    for reason, samples in acc["samples"].items():
        path = FileSystems.join(report_dir, "samples", sample_file_name(reason))
        with FileSystems.create(path) as fh:
            fh.write("".join(json.dumps(s, ensure_ascii=False) + "\n" for s in samples).encode("utf-8"))
    from tokenmill.transforms.report_html import render

    with FileSystems.create(FileSystems.join(report_dir, "report.html")) as fh:
        fh.write(render(report, acc["samples"]).encode("utf-8"))
    path = FileSystems.join(report_dir, "report.json")
    with FileSystems.create(path) as fh:
        fh.write(json.dumps(report, indent=2, ensure_ascii=False).encode("utf-8"))
    return path


class ReportFn(beam.CombineFn):
    def __init__(self, n_samples: int):
        self.n_samples = n_samples

    def create_accumulator(self):
        return new_acc()

    def add_input(self, acc, doc):
        return add_doc(acc, doc, self.n_samples)

    def merge_accumulators(self, accs):
        return merge(list(accs), self.n_samples)

    def extract_output(self, acc):
        return acc


# ---------------------------------------------------------------- terminal summary


def check_summary(report, where: str) -> dict[str, Any]:
    """``report`` as print_summary reads it (a report.json read back: someone's published
    output), or one UserError line naming the file and the field that is wrong."""
    from pydantic import ValidationError

    from tokenmill.errors import UserError

    try:
        _Summary.model_validate(report)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top)"
        raise UserError(f"{where}: {field}: {err['msg']}; this is no report `tokenmill prepare` wrote "
                        "(re-run it)") from None
    return report


def _summary_models():
    """The fields print_summary reads, with the bounds of what tokenmill writes: counts are
    whole numbers from 0 below 2**63, names are strings. Other fields are not read here."""
    from typing import Annotated

    from pydantic import BaseModel, ConfigDict, Field

    count = Annotated[int, Field(strict=True, ge=0, lt=2**63)]
    counts = dict[Annotated[str, Field(strict=True)], count]

    class Model(BaseModel):
        model_config = ConfigDict(extra="allow", strict=True)

    class Documents(Model):
        read: count
        kept: count
        dropped: count

    class Row(Model):
        stage: str
        in_: count = Field(alias="in")
        dropped: count
        out: count
        reasons: counts

    class Dedup(Model):
        clusters: count
        removed_exact: count
        removed_near: count

    class Summary(Model):
        documents: Documents
        funnel: list[Row]
        languages: counts
        chars_kept: count = 0
        tokens_kept: count | None = None
        inputs_skipped: counts | None = None
        pii_redactions: counts | None = None
        decontamination: counts | None = None
        dedup: Dedup | None = None

    return Summary


class _Lazy:  # pydantic's import stays off every worker's start: the models are made on first use
    def __getattr__(self, name):
        global _Summary
        _Summary = _summary_models()
        return getattr(_Summary, name)


_Summary: Any = _Lazy()


def print_summary(report: dict[str, Any], console=None) -> None:
    from rich.table import Table

    from tokenmill.terminal import console as safe_console
    from tokenmill.terminal import markup as m

    # Stage names, drop reasons, input names, language labels and file names are data (a
    # language model's labels, a report.json someone published): terminal.markup.
    console = console or safe_console()
    d = report["documents"]
    console.print(f"[bold]{d['read']:,}[/] documents read, [green]{d['kept']:,} kept[/], "
                  f"[red]{d['dropped']:,} dropped[/], {report.get('chars_kept', 0):,} characters kept")
    t = Table(title="Funnel", show_edge=False)
    for col in ("stage", "in", "dropped", "out", "top reasons"):
        t.add_column(col, justify="left" if col in ("stage", "top reasons") else "right")
    for row in report["funnel"]:
        if not row["in"] and not row["dropped"]:
            continue
        top = ", ".join(f"{m(r)} {n:,}" for r, n in list(row["reasons"].items())[:3])
        t.add_row(m(row["stage"]), f"{row['in']:,}", f"{row['dropped']:,}", f"{row['out']:,}", top)
    console.print(t)
    if report.get("inputs_skipped"):
        console.print("Inputs not read: " + ", ".join(f"{m(k)} {v:,}" for k, v in report["inputs_skipped"].items()))
    langs = list(report["languages"].items())[:12]
    if langs:
        console.print("Languages kept: " + ", ".join(f"{m(k)} {v:,}" for k, v in langs))
    if report.get("tokens_kept"):
        console.print(f"Tokens kept: {report['tokens_kept']:,}")
    if report.get("pii_redactions"):
        console.print("PII redacted: " + ", ".join(f"{m(k)} {v:,}" for k, v in report["pii_redactions"].items()))
    if report.get("decontamination"):
        console.print("Evaluation overlap: " + ", ".join(f"{m(k)} {v:,}" for k, v in report["decontamination"].items()))
    dedup = report.get("dedup")
    if dedup:
        console.print(f"Duplicates: {dedup['clusters']:,} clusters, removed {dedup['removed_exact']:,} exact + "
                      f"{dedup['removed_near']:,} near")
