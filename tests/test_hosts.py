"""`prepare` on a cluster whose workers share no disk: scripts/cluster.sh's hosts (each a network
namespace with its own address and a mount namespace without the launcher's files), a Flink
TaskManager and a tokenmill worker pool on each worker host, the JobManager and an S3 server on
another. The job reads and writes only s3://; its docs rows and shards are the in-process run's;
a lost host costs a restart, not a byte; a local path a worker would need is refused in one line
before submission.

Run by `make test-cluster` (as root: namespaces); skipped unless TOKENMILL_CLUSTER=1."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, SHARED_DATA, reaped, wait_for

SCRIPT = REPO / "scripts" / "cluster.sh"
TOKENMILL = [sys.executable, "-m", "tokenmill.cli"]
REST = f"http://127.0.0.1:{os.environ.get('HOSTS_REST_PORT', '8091')}"
NET = os.environ.get("HOSTS_NET", "10.77.0")
WORKERS = {f"{NET}.{10 + i}" for i in range(1, int(os.environ.get("HOSTS_WORKERS", "2")) + 1)}
BUCKET = "tokenmill"

pytestmark = pytest.mark.skipif(os.environ.get("TOKENMILL_CLUSTER") != "1",
                                reason="needs the hosts cluster: make test-cluster")


def sh(*args: str) -> str:
    return subprocess.run([str(SCRIPT), *args], check=True, capture_output=True, text=True).stdout


def rest(path: str):
    with urllib.request.urlopen(f"{REST}/{path}", timeout=10) as r:
        return json.load(r)


def jobs() -> dict[str, dict]:
    return {j["jid"]: j for j in rest("jobs/overview")["jobs"]}


def _input() -> Path:
    """The held-out-sized input where ../shared/data is here (99 real news pages), else the sample."""
    pages = SHARED_DATA / "html_extraction" / "scrapinghub_aeb"
    return pages if pages.exists() else REPO / "tokenmill" / "sample"


def tm(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*TOKENMILL, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def hosts():
    """The hosts cluster up, this process's environment reaching its S3 server (`env hosts`), the
    input uploaded to it."""
    sh("up", "hosts")
    exports = dict(kv.split("=", 1) for line in sh("env", "hosts").splitlines() for kv in line.split()[1:])
    saved = {k: os.environ.get(k) for k in exports}
    os.environ.update(exports)
    import boto3

    client = boto3.client("s3")
    src = _input()
    for f in sorted(src.rglob("*")):
        if f.is_file():
            client.put_object(Bucket=BUCKET, Key=f"in/{f.relative_to(src).as_posix()}", Body=f.read_bytes())
    try:
        yield client
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for p in pages for o in p.get("Contents", []))


def get(client, key: str) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def _rows(parquet: list[bytes]) -> list[dict]:
    rows = [r for data in parquet for r in pq.read_table(io.BytesIO(data)).to_pylist()]
    for r in rows:
        r.pop("source")  # the input's path: the store URL or the local path, by design
    return sorted(rows, key=lambda r: r["id"])


def _shards(manifest: dict) -> list[tuple[str, str]]:
    return [(s["file"].rsplit("/", 1)[1], s["sha256"]) for info in manifest["splits"].values() for s in info["shards"]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The in-process run of the same input, local to local."""
    out = tmp_path_factory.mktemp("in_process") / "out"
    r = tm("prepare", "--input", str(_input()), "--output", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-2000:]
    docs = sorted((out / "docs").glob("*.parquet"))
    return _rows([p.read_bytes() for p in docs]), _shards(json.loads((out / "manifest.json").read_text()))


def assert_published_equal(client, out: str, reference) -> dict:
    """OUT on the store holds the in-process run's rows and shards, and nothing but what its
    manifest names (no file of a lost attempt, no open multipart upload)."""
    want_rows, want_shards = reference
    manifest = json.loads(get(client, f"{out}/manifest.json"))
    docs = sorted(k for k in manifest["files"] if "/docs/" in k)
    assert docs and _rows([get(client, f"{out}/{k}") for k in docs]) == want_rows
    assert _shards(manifest) == want_shards
    named = {f"{out}/{k}" for k in manifest["files"]} | {f"{out}/manifest.json", f"{out}/{manifest['root']}/manifest.json"}
    assert set(keys(client, f"{out}/")) <= named, sorted(set(keys(client, f"{out}/")) - named)[:5]
    assert not client.list_multipart_uploads(Bucket=BUCKET, Prefix=f"{out}/").get("Uploads")
    return manifest


def flags(engine: str = "hosts") -> list[str]:
    return shlex.split(sh("flags", engine))


def test_hosts_run_equals_in_process(hosts, reference):
    """s3:// to s3:// on the TaskManagers of h1 and h2, each at its own address."""
    managers = rest("taskmanagers")["taskmanagers"]
    assert {m["path"].split("@", 1)[1].split(":", 1)[0] for m in managers} == WORKERS
    before = jobs()
    t0 = time.monotonic()
    r = tm("prepare", "--input", f"s3://{BUCKET}/in/", "--output", f"s3://{BUCKET}/out/hosts", "--quiet", *flags())
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"hosts run: {time.monotonic() - t0:.1f} s")
    new = [j for jid, j in jobs().items() if jid not in before]
    assert [j["state"] for j in new] == ["FINISHED"]  # it ran on the hosts' cluster
    assert new[0]["tasks"]["finished"] == new[0]["tasks"]["total"] > 0
    assert_published_equal(hosts, "out/hosts", reference)
    assert tm("inspect", f"s3://{BUCKET}/out/hosts").returncode == 0


def _vertex_running(jid: str, name_part: str) -> bool:
    return any(name_part in v["name"] and v["status"] == "RUNNING" for v in rest(f"jobs/{jid}")["vertices"])


def test_a_lost_host_costs_a_restart_not_a_byte(hosts, reference):
    """kill-host 1 while the clean phase runs, a fresh host 1 started: the job restarts under the
    restart strategy, and OUT is the uninterrupted run's; nothing of the lost attempt is published."""
    before = jobs()
    argv = [*TOKENMILL, "prepare", "--input", f"s3://{BUCKET}/in/", "--output", f"s3://{BUCKET}/out/lost",
            "--quiet", *flags()]
    jid = None
    try:
        with reaped(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                     start_new_session=True)) as proc:
            jid = wait_for(lambda: next((j for j in jobs() if j not in before), None), 180, proc)
            wait_for(lambda: _vertex_running(jid, "Extract"), 180, proc)  # the clean phase
            sh("kill-host", "1")
            sh("up", "hosts")  # a fresh host 1: empty disk, new TaskManager and worker pool
            _, err = proc.communicate(timeout=900)
    finally:
        with contextlib.suppress(OSError, KeyError, ValueError):  # (the test's own failure is the news)
            if jid and jobs()[jid]["state"] not in ("FINISHED", "FAILED", "CANCELED"):
                urllib.request.urlopen(urllib.request.Request(f"{REST}/jobs/{jid}?mode=cancel", method="PATCH"))
    assert proc.returncode == 0, err[-3000:]
    assert rest(f"jobs/{jid}")["state"] == "FINISHED"
    history = rest(f"jobs/{jid}/exceptions")["exceptionHistory"]["entries"]
    assert history, "the job was not restarted: the host died too late to matter"
    assert_published_equal(hosts, "out/lost", reference)


def test_a_local_path_is_refused_before_submission(hosts, tmp_path):
    """The workers cannot see this machine's disk: a local --input, or a local model, is one line
    naming the setting and a worker's address, and nothing reaches the cluster."""
    model = tmp_path / "lid.ftz"
    model.write_bytes(b"not read")
    before = jobs()
    for args, setting in [(["--input", str(_input())], "--input"),
                          (["--input", f"s3://{BUCKET}/in/", "--set", f"language.model={model}"], "language.model")]:
        r = tm("prepare", *args, "--output", f"s3://{BUCKET}/out/refused", *flags(), timeout=300)
        assert r.returncode == 2
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith(f"tokenmill: error: {setting} "), r.stderr
        assert any(w in lines[0] for w in WORKERS), lines
    assert jobs() == before
    assert not keys(hosts, "out/refused/")


SPARK_UI = f"http://127.0.0.1:{os.environ.get('HOSTS_SPARK_UI_PORT', '8092')}"


def spark_apps() -> dict[str, dict]:
    with urllib.request.urlopen(f"{SPARK_UI}/json/", timeout=10) as r:
        return {a["id"]: a for a in json.load(r)["completedapps"]}


def test_spark_on_the_hosts_equals_in_process(hosts, reference):
    """The same job on Spark: a Master and Beam's Spark job server (the driver) on h0, a Worker
    on each worker host whose executors use that host's worker pool."""
    with urllib.request.urlopen(f"{SPARK_UI}/json/", timeout=10) as r:
        workers = json.load(r)["workers"]
    assert {w["host"] for w in workers if w["state"] == "ALIVE"} == WORKERS
    before = spark_apps()
    t0 = time.monotonic()
    r = tm("prepare", "--input", f"s3://{BUCKET}/in/", "--output", f"s3://{BUCKET}/out/spark", "--quiet",
           *flags("hosts-spark"))
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"hosts spark run: {time.monotonic() - t0:.1f} s")
    new = [a for aid, a in spark_apps().items() if aid not in before]
    assert [a["state"] for a in new] == ["FINISHED"]  # the hosts' Master ran it
    assert_published_equal(hosts, "out/spark", reference)


def test_models_and_lists_reach_the_workers_through_the_store(hosts, reference, tmp_path):
    """The language model, a URL block list and a decontamination list named by s3:// URL: the
    workers on h1 and h2 read them from the store (the launcher's disk is not theirs) and the
    job gives what the in-process run gives with the same settings."""
    lid = REPO / "tokenmill" / "models" / "lid.176.ftz"
    hosts.put_object(Bucket=BUCKET, Key="lists/lid.176.ftz", Body=lid.read_bytes())
    hosts.put_object(Bucket=BUCKET, Key="lists/block.txt", Body=b"example.invalid\n")
    kept = next(r for r in reference[0] if r["dropped_by"] is None and len(r["text"].split()) >= 40)
    words = kept["text"].split()[10:30]  # an evaluation item that is in a kept document
    hosts.put_object(Bucket=BUCKET, Key="lists/eval.txt", Body=(" ".join(words) + "\n").encode())
    sets = ["--set", f"language.model=s3://{BUCKET}/lists/lid.176.ftz",
            "--set", f"url.block_files=['s3://{BUCKET}/lists/block.txt']",
            "--set", f"decontaminate.files=['s3://{BUCKET}/lists/eval.txt']"]
    local = tmp_path / "out"
    r = tm("prepare", "--input", str(_input()), "--output", str(local), "--quiet", *sets)
    assert r.returncode == 0, r.stderr[-2000:]
    want = _rows([p.read_bytes() for p in sorted((local / "docs").glob("*.parquet"))])
    report = json.loads((local / "report" / "report.json").read_text())
    assert report["dropped_by"].get("decontaminate:overlap", 0) >= 1, report["dropped_by"]
    r = tm("prepare", "--input", f"s3://{BUCKET}/in/", "--output", f"s3://{BUCKET}/out/lists", "--quiet",
           *sets, *flags())
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads(get(hosts, "out/lists/manifest.json"))
    docs = sorted(k for k in manifest["files"] if "/docs/" in k)
    assert _rows([get(hosts, f"out/lists/{k}") for k in docs]) == want
