"""The same pipeline on three local runners gives the same survivors, texts and shard bytes."""

import json

import pytest
from conftest import run_prepare

RUNNERS = {
    "in_memory": ["--direct_running_mode=in_memory"],
    "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    "portable_loopback": ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, flags in RUNNERS.items():
        d = tmp_path_factory.mktemp(name) / "out"
        rc, rows, report = run_prepare(d, [], sets=["tokenize.vocab_size=1000"], extra=flags)
        assert rc == 0, name
        out[name] = (d, rows, report)
    return out


def test_same_survivors_texts_and_shards(runs):
    ref_dir, ref_rows, ref_report = runs["in_memory"]
    ref = {r["id"]: (r["text"], r["dropped_by"], r["dup_cluster"]) for r in ref_rows}
    ref_manifest = json.loads((ref_dir / "manifest.json").read_text())
    for name, (d, rows, report) in runs.items():
        assert {r["id"]: (r["text"], r["dropped_by"], r["dup_cluster"]) for r in rows} == ref, name
        assert report["dropped_by"] == ref_report["dropped_by"], name
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["splits"] == ref_manifest["splits"], name
        for info in manifest["splits"].values():
            for s in info["shards"]:
                assert (d / s["file"]).read_bytes() == (ref_dir / s["file"]).read_bytes()
