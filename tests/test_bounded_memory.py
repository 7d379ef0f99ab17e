"""No document text or token list crosses a shuffle or waits for a side input (docs/design.md,
"Bounded memory by construction"), checked where it would show: Beam's in-memory runner keeps
every PCollection that crosses a GroupByKey, a Flatten between stages or a side-input wait.

Two runs of ``prepare`` in a fresh process each, on 300 and on 900 documents of 100 KB (30 and 90
MB of text, ~1.1 token bytes per character at a 400-token vocabulary), everything surviving every
stage that runs (dedup and tokenization included, with shards). Had the documents or their tokens
crossed one of those points, the larger run would hold them: 60 MB or more on top of the smaller.
Both sizes are past the fixed buffers (a Parquet row group per file, a token batch per shard),
which fill up to ~40 MB of text: measured, 150 -> 400 -> 1,200 documents peak at 338 -> 368 ->
374 MB.
"""

import json
import random
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a big corpus, measured in subprocesses

SCRIPT = """
import resource, sys
from tokenmill.cli import main
rc = main(sys.argv[1:])
print("MAXRSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, rc)
"""


def _corpus(path, n: int, chars: int = 100_000, seed: int = 3) -> None:
    rng = random.Random(seed)
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(50_000)]
    with open(path, "w") as fh:
        for i in range(n):
            words, size = [], 0
            while size < chars:
                w = rng.choice(vocab)
                words.append(w)
                size += len(w) + 1
            fh.write(json.dumps({"id": f"doc{i:05d}", "text": " ".join(words)}) + "\n")


def _peak_kib(tmp_path, name: str, n: int, tokenizer) -> int:
    inp = tmp_path / f"{name}.jsonl"
    _corpus(inp, n)
    sets = ["normalize.enabled=false", "language.enabled=false", "quality.enabled=false", "pii.enabled=false",
            f"tokenize.tokenizer={tokenizer}", "tokenize.batch_size=8", "shards.buckets=4"]
    argv = ["prepare", "--input", str(inp), "--output", str(tmp_path / f"out-{name}"),
            "--direct_running_mode=in_memory"]
    for s in sets:
        argv += ["--set", s]
    run = subprocess.run([sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True, timeout=600)
    line = [x for x in run.stdout.splitlines() if x.startswith("MAXRSS")]
    assert run.returncode == 0 and line, run.stderr[-2000:]
    _, kib, rc = line[-1].split()
    assert rc == "0", run.stderr[-2000:]
    report = json.loads((tmp_path / f"out-{name}" / "report" / "report.json").read_text())
    assert report["documents"]["kept"] == n  # all survive: the big run really carries 40 MB of text to the end
    return int(kib)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from tokenmill.transforms.tokenization import train_tokenizer

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    rng = random.Random(1)
    texts = [" ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=5)) for _ in range(200))
             for _ in range(50)]
    path.write_text(train_tokenizer(texts, 400, "bpe").to_str())
    return path


def test_memory_does_not_grow_with_the_corpus(tmp_path, tokenizer):
    small = _peak_kib(tmp_path, "small", 300, tokenizer)
    big = _peak_kib(tmp_path, "big", 900, tokenizer)
    grew_mb = (big - small) / 1024
    assert grew_mb < 25, f"peak RSS grew by {grew_mb:.0f} MB for 60 MB more text (small run {small / 1024:.0f} MB)"
