"""Loss spikes traced to their documents.

During training, a step whose loss exceeds ``train.spike_factor`` times the median of the
previous ``train.spike_window`` steps is appended to RUN/spikes.jsonl with the ids of the
documents its global batch was cut from. The batch of a step is a pure function of (seed,
samples consumed), so rank 0 finds every rank's documents itself, from the shards' own
offsets. ``tokenmill spikes RUN --data OUT`` prints them with their URLs and the start of their
text from OUT/docs.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
from collections import deque

from tokenmill.errors import UserError

FILE = "spikes.jsonl"


class SpikeLog:
    def __init__(self, run: str, enabled: bool, factor: float, window: int, docs_of, seq_len: int, global_batch: int):
        """``docs_of(g)``: ids of the documents of global sample g."""
        self.path = os.path.join(run, FILE)
        self.enabled = enabled and factor > 0
        self.factor, self.docs_of, self.seq_len, self.G = factor, docs_of, seq_len, global_batch
        self.recent: deque[float] = deque(maxlen=window)

    def check(self, row: dict) -> dict | None:
        """Called with every step's completed row, in order; returns the spike it logged."""
        loss = row.get("loss")
        if not self.enabled or loss is None or row.get("skipped"):
            return None
        spike = None
        if len(self.recent) >= min(10, self.recent.maxlen):
            median = statistics.median(self.recent)
            if loss > self.factor * median:
                end = row["tokens"] // self.seq_len  # samples consumed after this step
                docs = list(dict.fromkeys(d for g in range(end - self.G, end) for d in self.docs_of(g)))
                spike = {"step": row["step"], "loss": loss, "median": median, "samples": [end - self.G, end],
                         "docs": docs}
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(spike) + "\n")
        self.recent.append(loss)
        return spike


def read_spikes(run: str) -> list[dict]:
    path = os.path.join(run, FILE)
    if not os.path.isdir(run):
        raise UserError(f"{run}: no such run folder")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def lookup_docs(out: str, ids: set[str]) -> dict[str, dict]:
    """id -> {url, text} from OUT/docs (kept, then the rest), reading only the matching rows."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    files = sorted(glob.glob(os.path.join(out, "docs", "*.parquet")))
    if not files:
        raise UserError(f"--data {out}: no docs/*.parquet (not a prepared output?)")
    table = ds.dataset(files, format="parquet").to_table(columns=["id", "url", "text"],
                                                          filter=pc.field("id").isin(sorted(ids)))
    return {r["id"]: r for r in table.to_pylist()}


def show(run: str, out: str, chars: int = 100, console=None) -> int:
    from tokenmill.terminal import console as safe_console
    from tokenmill.terminal import markup as escape

    console = console or safe_console()
    if "://" in out:  # on an object store: its docs fetched into the local cache, checked
        from tokenmill.format import local_view

        out = local_view(out, files=True)
    spikes = read_spikes(run)
    if not spikes:
        console.print(f"{escape(run)}: no loss spikes logged ({FILE} is empty or absent)")
        return 0
    docs = lookup_docs(out, {d for s in spikes for d in s["docs"]})
    for s in spikes:
        console.print(f"[bold]step {s['step']}[/]: loss {s['loss']:.4f} = {s['loss'] / s['median']:.2f} x the recent "
                      f"median {s['median']:.4f}; samples {s['samples'][0]:,}-{s['samples'][1]:,}, "
                      f"{len(s['docs'])} document(s)")
        for d in s["docs"]:
            row = docs.get(d)
            if row is None:
                console.print(f"  {escape(d)}  (not in {escape(out)}/docs)")
                continue
            text = " ".join((row.get("text") or "").split())[:chars]
            console.print(f"  {escape(d)}  {escape(row.get('url') or '')}\n    {escape(text)}")
    return len(spikes)
