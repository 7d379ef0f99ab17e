"""The live progress line of `prepare`: the workers' counts reach the launcher in every local
mode (in-process and multi_processing subprocesses) and add up to the job's own totals; the
line itself; a worker writes at most once a second."""

import io
import json

import pytest
from rich.console import Console

from tokenmill.cli import sample_inputs
from tokenmill.config import load_config
from tokenmill.pipelines import prepare
from tokenmill.pipelines.progress_line import Display, progress_line, read_totals
from tokenmill.transforms.progress_counts import Reporter


@pytest.mark.parametrize("mode", ["in_memory", "multi_processing"])
@pytest.mark.slow
def test_progress_totals_match_the_report(tmp_path, mode):
    cfg = load_config(None, ["tokenize.vocab_size=600"])
    cfg.inputs, cfg.output = sample_inputs(), str(tmp_path / "out")
    display = Display(Console(file=io.StringIO(), force_terminal=True, width=200))
    report_path = prepare.run(cfg, [f"--direct_running_mode={mode}", "--direct_num_workers=2"], display)
    report = json.loads(open(report_path).read())
    inputs = [json.loads(line) for line in (tmp_path / "out" / "inputs.jsonl").read_text().splitlines()]
    t = display.totals
    dups = sum(n for reason, n in report["dropped_by"].items() if reason.startswith("dedup:"))
    assert t["bytes"] == display.total_bytes == sum(i["size"] for i in inputs)
    assert t["kept"] == report["documents"]["kept"] and t["duplicates"] == dups
    assert t["filtered"] + t["passed"] == report["documents"]["read"]
    assert t["filtered"] == report["documents"]["dropped"] - dups
    assert t["buckets"] == display.buckets > 0
    assert not (tmp_path / "out" / ".tmp").exists()  # the progress files are never published


def test_progress_line_reads_like_a_person_wants():
    t = {"bytes": 50 * 2**20, "read": 1000, "filtered": 100, "passed": 900, "kept": 0, "duplicates": 0, "buckets": 0}
    line = progress_line(t, 200 * 2**20, 8, elapsed=10.0)
    assert "read 50.0 of 200.0 MB (25%)" in line and "1,000 docs (100/s)" in line and "ETA 0:30" in line
    done = progress_line({**t, "bytes": 200 * 2**20, "kept": 800, "duplicates": 50, "buckets": 3}, 200 * 2**20, 8, 70.0)
    assert "kept 800, duplicates 50 (3/8 buckets written)" in done and "1:10 elapsed" in done and "ETA" not in done


def test_a_worker_writes_at_most_once_a_second(tmp_path):
    r = Reporter(str(tmp_path))
    r.add(read=1)  # the first call writes
    before = (tmp_path / r.path.rsplit("/", 1)[1]).stat().st_mtime_ns
    for _ in range(1000):
        r.add(read=1)
    assert (tmp_path / r.path.rsplit("/", 1)[1]).stat().st_mtime_ns == before
    assert read_totals(str(tmp_path))["read"] == 1
    r.flush()
    assert read_totals(str(tmp_path))["read"] == 1001
