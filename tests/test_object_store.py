"""Every command on s3:// against a real S3 server (Versity's gateway) and on gs:// against
fake-gcs-server, both started by scripts/cluster.sh; the commit protocol under SIGKILL and
concurrent runs; no secret in anything a run writes; the server stopped mid-run. Skipped where
a server is not built (`scripts/cluster.sh install s3 gcs`); CI builds them and sets
TOKENMILL_REQUIRE_S3=1, which turns the skip into a failure. (The fixture keeps the name s3.)"""

from __future__ import annotations

import glob
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.conftest import REPO, SHARED_DATA, free_port

pytestmark = pytest.mark.slow
SCRIPT = REPO / "scripts" / "cluster.sh"
TOKENMILL = [sys.executable, "-m", "tokenmill.cli"]
BUCKET = "tmtest"


class Server:
    """A store server of scripts/cluster.sh (``kind``: s3 or gcs) on a free port, its data in ``run``."""

    def __init__(self, kind: str, run: Path):
        self.kind, self.run, self.port = kind, run, free_port()
        self.scheme = "s3" if kind == "s3" else "gs"
        up = kind.upper()
        self.env = {**os.environ, f"{up}_RUN": str(run), f"{up}_PORT": str(self.port), f"{up}_BUCKET": BUCKET}

    def url(self, key: str) -> str:
        return f"{self.scheme}://{BUCKET}/{key}"

    def sh(self, *args: str) -> str:
        return subprocess.run([str(SCRIPT), *args], env=self.env, check=True, capture_output=True, text=True).stdout

    def up(self) -> None:
        self.sh("up", self.kind)

    def down(self) -> None:
        self.sh("down", self.kind)

    def exports(self) -> dict[str, str]:
        return dict(kv.split("=", 1) for line in self.sh("env", self.kind).splitlines() for kv in line.split()[1:])

    def client(self):
        import boto3

        return boto3.client("s3")

    def keys(self, prefix: str) -> list[str]:
        if self.scheme == "gs":
            from tokenmill.store import gcs_client

            return sorted(b.name for b in gcs_client().list_blobs(BUCKET, prefix=prefix))
        c = self.client()
        return sorted(o["Key"] for p in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
                      for o in p.get("Contents", []))

    def get(self, key: str) -> bytes:
        if self.scheme == "gs":
            from tokenmill.store import gcs_client

            return gcs_client().bucket(BUCKET).blob(key).download_as_bytes()
        return self.client().get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def uploads(self, prefix: str) -> list[str]:
        if self.scheme == "gs":  # GCS keeps no listable unfinished uploads
            return []
        return [u["Key"] for u in self.client().list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])]

    def put_tree(self, local: Path, prefix: str) -> str:
        from tokenmill.store import Store

        st = Store(self.url(prefix))
        for f in sorted(local.rglob("*")):
            if f.is_file():
                st.write(self.url(f"{prefix}/{f.relative_to(local).as_posix()}"), f.read_bytes())
        return self.url(prefix) + "/"


def _binary(kind: str) -> Path:
    text = (REPO / "cluster" / "versions.env").read_text()
    name, var = {"s3": ("versitygw", "VERSITYGW_VERSION"), "gcs": ("fake-gcs-server", "FAKE_GCS_VERSION")}[kind]
    version = re.search(rf"^{var}=(\S+)", text, re.M).group(1)
    return REPO / ".cluster" / "bin" / f"{name}-{version}"


@pytest.fixture(scope="module", params=["s3", "gcs"])
def s3(request, tmp_path_factory):
    """The store under test: Versity's S3 gateway, or fake-gcs-server (GCS's API, not GCS: no
    IAM, no real resumable-upload expiry, no rate limits; what it proves is the client path)."""
    kind = request.param
    if not _binary(kind).exists():
        if os.environ.get("TOKENMILL_REQUIRE_S3"):
            pytest.fail(f"the {kind} server is not built: scripts/cluster.sh install {kind}")
        pytest.skip(f"the {kind} server is not built (scripts/cluster.sh install {kind})")
    pytest.importorskip("boto3" if kind == "s3" else "google.cloud.storage")
    server = Server(kind, tmp_path_factory.mktemp(kind))
    server.up()
    exports = server.exports()
    saved = {k: os.environ.get(k) for k in exports}
    os.environ.update(exports)
    try:
        yield server
    finally:
        server.down()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def s3_only(server: Server) -> None:
    if server.scheme != "s3":
        pytest.skip("S3's case (the GCS emulator has no credentials to leak, and is in-process state)")


def _input() -> Path:
    """The held-out-sized input where ../shared/data is here (99 real news pages), else the sample."""
    pages = SHARED_DATA / "html_extraction" / "scrapinghub_aeb"
    return pages if pages.exists() else REPO / "tokenmill" / "sample"


def tm(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([*TOKENMILL, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)


def _rows(files: list[tuple[str, bytes]]) -> list[dict]:
    rows = [r for _, data in files for r in pq.read_table(io.BytesIO(data)).to_pylist()]
    for r in rows:
        r.pop("source")  # the input's path: the store URL or the local path, by design
    return sorted(rows, key=lambda r: r["id"])


def _local_docs(out: Path) -> list[tuple[str, bytes]]:
    return [(f, Path(f).read_bytes()) for f in sorted(glob.glob(str(out / "docs" / "*.parquet")))]


def _s3_docs(s3: Server, out: str) -> list[tuple[str, bytes]]:
    manifest = json.loads(s3.get(f"{out}/manifest.json"))
    keys = [k for k in manifest["files"] if "/docs/" in k]
    return [(k, s3.get(f"{out}/{k}")) for k in sorted(keys)]


def _shard_hashes(manifest: dict) -> list[tuple[str, str]]:
    return [(s["file"].rsplit("/", 1)[1], s["sha256"]) for info in manifest["splits"].values() for s in info["shards"]]


@pytest.fixture(scope="module")
def outputs(s3, tmp_path_factory):
    """The same job local -> local, s3 -> s3 (two worker processes), s3 -> local, local -> s3."""
    tmp = tmp_path_factory.mktemp("outs")
    src = _input()
    remote_in = s3.put_tree(src, "in")
    runs = {"local": (str(src), str(tmp / "local"), []),
            "s3-s3": (remote_in, s3.url("out/s3s3"), ["--direct_running_mode=multi_processing",
                                                             "--direct_num_workers=2"]),
            "s3-local": (remote_in, str(tmp / "s3local"), []),
            "local-s3": (str(src), s3.url("out/locals3"), [])}
    said = {}
    for name, (inp, out, flags) in runs.items():
        r = tm("prepare", "--input", inp, "--output", out, "--quiet", *flags)
        assert r.returncode == 0, (name, r.stderr[-2000:])
        said[name] = r.stdout + r.stderr
    return runs, said


def test_s3_output_equals_local(s3, outputs):
    runs, _ = outputs
    local = Path(runs["local"][1])
    want_rows = _rows(_local_docs(local))
    want_shards = _shard_hashes(json.loads((local / "manifest.json").read_text()))
    assert want_rows and want_shards
    for name in ("s3-s3", "local-s3"):
        out = runs[name][1].split(s3.url(""), 1)[1]
        assert _rows(_s3_docs(s3, out)) == want_rows, name
        manifest = json.loads(s3.get(f"{out}/manifest.json"))
        assert _shard_hashes(manifest) == want_shards, name
        # the published layout: the manifest and one run prefix; nothing else, no open upload
        keys = s3.keys(out + "/")
        assert {k.split("/")[2] for k in keys} == {"manifest.json", manifest["root"]}, keys[:5]
        assert not s3.uploads(out + "/")
        assert all(f"{out}/{k}" in keys for k in manifest["files"])
    s3local = Path(runs["s3-local"][1])
    assert _rows(_local_docs(s3local)) == want_rows
    assert _shard_hashes(json.loads((s3local / "manifest.json").read_text())) == want_shards


def test_every_command_on_an_s3_output(s3, outputs, tmp_path):
    out = outputs[0]["s3-s3"][1]
    r = tm("report", out)
    assert r.returncode == 0 and "report.html" in r.stdout, r.stderr
    r = tm("inspect", out)
    assert r.returncode == 0 and "all checksums and counts match" in r.stdout, r.stderr
    for target in (s3.url("export/nanogpt"), str(tmp_path / "nanogpt")):
        r = tm("export", out, "--format", "nanogpt", "--output", target)
        assert r.returncode == 0, r.stderr
    assert (tmp_path / "nanogpt" / "train.bin").stat().st_size > 0
    assert "export/nanogpt/train.bin" in s3.keys("export/")
    r = tm("refilter", out, "--output", s3.url("out/refiltered"), "--set", "quality.gopher.min_words=80", "--quiet")
    assert r.returncode == 0, r.stderr
    assert tm("inspect", s3.url("out/refiltered")).returncode == 0
    env = {**os.environ, "TOKENMILL_CACHE": str(tmp_path / "cache")}
    r = tm("tokenizer", "train", "--input", out, "--output", str(tmp_path / "tok.json"), "--vocab-size", "400", env=env)
    assert r.returncode == 0 and "trained a bpe tokenizer" in r.stdout, r.stderr
    r = tm("classifier", "train", "--positive", out, "--negative", str(REPO / "tokenmill" / "sample" / "docs.jsonl"),
           "--output", str(tmp_path / "cls.bin"), "--epoch", "5", env=env)
    assert r.returncode == 0 and "trained a fastText classifier" in r.stdout, r.stderr
    pytest.importorskip("torch")
    r = tm("train", "--data", out, "--run", str(tmp_path / "run"), "--set", "train.steps=4", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(s["step"] for s in steps if "step" in s) == 4
    r = tm("compare", out, s3.url("out/refiltered"), "--eval", out, "--tokens", "2000", "--seeds", "1",
           "--output", str(tmp_path / "compare"), env=env)
    assert r.returncode == 0 and (tmp_path / "compare" / "compare.json").exists(), r.stderr[-2000:]
    # the cache holds each file once, named by its checked sha256
    blobs = [p for p in (tmp_path / "cache").iterdir() if len(p.name) == 64]
    assert blobs and all(__import__("hashlib").sha256(p.read_bytes()).hexdigest() == p.name for p in blobs)


def _prepare_proc(out: str, env=None) -> subprocess.Popen:
    return subprocess.Popen([*TOKENMILL, "prepare", "--output", out, "--quiet"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(s3: Server, prefix: str, needle: str, proc: subprocess.Popen, limit_s: float = 120) -> bool:
    end = time.time() + limit_s
    while time.time() < end and proc.poll() is None:
        if any(needle in k for k in s3.keys(prefix)):
            return True
        time.sleep(0.02)
    return False


def test_a_killed_run_never_breaks_out(s3):
    out = s3.url("out/killed")
    assert tm("prepare", "--output", out, "--quiet").returncode == 0
    first = json.loads(s3.get("out/killed/manifest.json"))
    left = {}
    for moment, needle in (("early", None), ("mid-job", "/.tmp/"), ("publish", "/report/report.json")):
        proc = _prepare_proc(out)
        if needle is None:
            time.sleep(1.0)
        else:
            _wait_for(s3, "out/killed/", needle, proc)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        r = tm("inspect", out)
        assert r.returncode == 0 and "all checksums and counts match" in r.stdout, (moment, r.stdout[-500:], r.stderr)
        left[moment] = s3.keys("out/killed/")
    # a clean rerun removes whatever the dead runs left
    assert tm("prepare", "--output", out, "--quiet").returncode == 0
    manifest = json.loads(s3.get("out/killed/manifest.json"))
    assert _shard_hashes(manifest) == _shard_hashes(first)
    keys = s3.keys("out/killed/")
    assert {k.split("/")[2] for k in keys} == {"manifest.json", manifest["root"]}
    assert not s3.uploads("out/killed/")
    print({m: len(k) for m, k in left.items()})


def test_two_runs_into_one_out(s3):
    out = s3.url("out/twice")
    procs = [_prepare_proc(out), _prepare_proc(out)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert any(rc == 0 for rc, _ in results), results
    for rc, err in results:
        if rc != 0:
            assert err.strip().splitlines() == [err.strip()] and "is in use by another tokenmill prepare" in err, err
    assert tm("inspect", out).returncode == 0
    assert not [k for k in s3.keys("out/twice/") if k.endswith(".tokenmill.lock")]


def test_no_secret_leaves(s3, outputs, tmp_path):
    s3_only(s3)
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    # the credentials as Beam's flags, none in the environment
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    flags = [f"--s3_endpoint_url={os.environ['AWS_ENDPOINT_URL']}", f"--s3_access_key_id={os.environ['AWS_ACCESS_KEY_ID']}",
             f"--s3_secret_access_key={secret}", "--s3_region_name=us-east-1"]
    said = []
    r = tm("prepare", "--output", s3.url("out/flags"), "--quiet", *flags, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    said.append(r.stdout + r.stderr)
    for args in (["inspect", s3.url("out/flags")], ["report", s3.url("out/flags")]):
        r = tm(*args, *flags, env=env)
        assert r.returncode == 0, r.stderr
        said.append(r.stdout + r.stderr)
    r = tm("prepare", "--output", s3.url("out/flags"), "--runner=NoSuchRunner", *flags, env=env)
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    said.append(r.stdout + r.stderr)
    said += list(outputs[1].values())
    for text in said:
        assert secret not in text
    # every object the server holds (outputs, reports, docs, manifests, locks) and every local output
    files = [p for p in Path(s3.run, "data").rglob("*") if p.is_file()]
    files += [p for name in ("local", "s3-local") for p in Path(outputs[0][name][1]).rglob("*") if p.is_file()]
    assert files
    for f in files:
        assert secret.encode() not in f.read_bytes(), f


def test_server_stopped_mid_run(s3):
    s3_only(s3)
    out = s3.url("out/outage")
    assert tm("prepare", "--output", out, "--quiet").returncode == 0
    proc = _prepare_proc(out)
    _wait_for(s3, "out/outage/", "/.tmp/", proc)
    s3.down()
    try:
        rc = proc.wait(timeout=300)
        err = proc.stderr.read().strip()
    finally:
        s3.up()
    assert rc != 0
    assert len(err.splitlines()) == 1 and err.startswith("tokenmill: error:") and "Traceback" not in err, err
    r = tm("inspect", out)
    assert r.returncode == 0 and "all checksums and counts match" in r.stdout, r.stderr


def test_a_throttling_store(s3):
    """503 SlowDown on every 4th request, 10 ms added to each: the run retries and gives the same
    bytes; a store that throttles every request ends the run in one line, in bounded time."""
    s3_only(s3)
    from tests.throttling_proxy import ThrottlingProxy

    assert tm("prepare", "--output", s3.url("out/plain"), "--quiet").returncode == 0
    want = _shard_hashes(json.loads(s3.get("out/plain/manifest.json")))
    with ThrottlingProxy(s3.port, every=4, delay_s=0.01) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
        r = tm("prepare", "--output", s3.url("out/throttled"), "--quiet", env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        assert proxy.throttled >= 10, proxy.throttled
        assert _shard_hashes(json.loads(s3.get("out/throttled/manifest.json"))) == want
        proxy.every = 1
        t = time.time()
        r = tm("prepare", "--output", s3.url("out/throttled"), "--quiet", env=env, timeout=300)
        took = time.time() - t
    err = r.stderr.strip()
    assert r.returncode == 2 and len(err.splitlines()) == 1 and "SlowDown" in err, err
    assert took < 120, took
    r = tm("inspect", s3.url("out/throttled"))
    assert r.returncode == 0 and "all checksums and counts match" in r.stdout, r.stderr


def test_a_lock_that_is_not_a_runs_is_taken_over_and_a_live_one_is_not(s3):
    """A lock object of no run (garbage, or a list) is taken over; a live run's on another host
    is refused in one line until its lease lapses."""
    import socket as _socket

    from tokenmill.store import Store

    out = s3.url("out/locked")
    st = Store(out)
    st.write(f"{out}/.tokenmill.lock", b"[1, 2]")
    assert tm("prepare", "--output", out, "--quiet").returncode == 0
    live = {"run": "x", "host": "elsewhere-" + _socket.gethostname(), "boot": "", "pid": 1, "expires": time.time() + 600}
    st.write(f"{out}/.tokenmill.lock", json.dumps(live).encode())
    r = tm("prepare", "--output", out, "--quiet")
    assert r.returncode == 2 and "is in use by another tokenmill prepare (host elsewhere-" in r.stderr, r.stderr
    live["expires"] = time.time() - 1  # its lease lapsed: the run died
    st.write(f"{out}/.tokenmill.lock", json.dumps(live).encode())
    assert tm("prepare", "--output", out, "--quiet").returncode == 0
    assert tm("inspect", out).returncode == 0


def test_killed_inside_the_commit(s3):
    """SIGKILL while the run publishes (its files all written, the manifest not yet): the request
    that hashes the new report.html, which only the commit makes, is held by a proxy in front of
    the gateway and the run killed then. The previous output stays whole; the next run removes
    what the dead one left."""
    s3_only(s3)
    from tests.throttling_proxy import ThrottlingProxy

    out = s3.url("out/commit-kill")
    assert tm("prepare", "--output", out, "--quiet").returncode == 0
    before = json.loads(s3.get("out/commit-kill/manifest.json"))
    hold = lambda method, path: 30.0 if method == "GET" and path.split("?")[0].endswith("/report/report.html") else 0  # noqa: E731
    with ThrottlingProxy(s3.port, every=0, hold=hold) as proxy:
        env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{proxy.port}"}
        proc = subprocess.Popen([*TOKENMILL, "prepare", "--output", out, "--quiet", "--set", "quality.gopher.min_words=80"],
                                cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                start_new_session=True)
        assert proxy.held.wait(120), proc.stderr.read() if proc.poll() is not None else "not held"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert json.loads(s3.get("out/commit-kill/manifest.json")) == before  # the commit never happened
    r = tm("inspect", out)
    assert r.returncode == 0 and "all checksums and counts match" in r.stdout, r.stderr
    left = {k.split("/")[2] for k in s3.keys("out/commit-kill/")}
    assert ".tokenmill.lock" in left  # the dead run's: taken over below (its pid is gone)
    roots = left - {"manifest.json", ".tokenmill.lock"}
    assert len(roots) == 2 and before["root"] in roots, roots  # the committed root, and the dead run's
    assert tm("prepare", "--output", out, "--quiet").returncode == 0
    manifest = json.loads(s3.get("out/commit-kill/manifest.json"))
    assert {k.split("/")[2] for k in s3.keys("out/commit-kill/")} == {"manifest.json", manifest["root"]}


def test_files_of_every_size_through_beams_filesystem(s3):
    """What the pipeline's steps write through Beam's filesystem (spill, candidate and stash
    files; docs): empty, small (one PutObject), and past the 5 MB part size (a multipart upload
    of several parts and a rest), each read back whole; a write that is aborted leaves neither an
    object nor an open upload."""
    from tokenmill.beamfs import FileSystems, abort_write

    data = bytes(range(256)) * (45 * 1024)  # 11.5 MB
    for n in (0, 1000, 5 * 1024 * 1024, len(data)):
        url = s3.url(f"sizes/{n}.bin")
        f = FileSystems.create(url)
        for i in range(0, n, 1 << 20):
            f.write(data[i:min(n, i + (1 << 20))])
        f.close()
        with FileSystems.open(url, compression_type="uncompressed") as g:
            assert g.read() == data[:n], n
    for n, name in ((len(data), "aborted.bin"), (5 * 1024 * 1024 - 65536, "aborted-small.bin")):
        f = FileSystems.create(s3.url(f"sizes/{name}"))  # (the second: its buffer flushed on close passes 5 MB)
        f.write(data[:n])
        abort_write(f)
    assert s3.keys("sizes/") == sorted(f"sizes/{n}.bin" for n in (0, 1000, 5 * 1024 * 1024, len(data)))
    assert not s3.uploads("sizes/")


TINY = ["model.preset=null", "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "train.micro_batch=2",
        "data.seq_len=32", "checkpoint.every=0", "eval.every=0", "optim.lr=5e-3", "export.enabled=false",
        "metrics.tensorboard=false", "precision=fp32", "data.shuffle_shards=1", "data.lanes=2"]


def _losses(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def _store_train_env(s3: Server, out: str, cache: Path, shards: float) -> dict:
    """The trainer's environment: its own cache, bounded to ``shards`` times the biggest shard."""
    manifest = json.loads(s3.get(out.split(s3.url(""), 1)[1] + "/manifest.json"))
    biggest = max(s["bytes"] for info in manifest["splits"].values() for s in info["shards"])
    return {**os.environ, "TOKENMILL_CACHE": str(cache), "TOKENMILL_CACHE_GB": str(shards * biggest / 2**30),
            "OMP_NUM_THREADS": "1"}


def test_training_on_a_store_output_resumes_exactly(s3, outputs, tmp_path):
    """`train --data s3://...` in the grouped order (one shard a group, two lanes) through a cache
    of about five shards, stopped mid-run (SIGTERM: a checkpoint at the step's end), the same
    command again: it resumes there, and every step's loss is the uninterrupted run's. (300 steps
    of a tiny model: long enough that the stop lands mid-run.)"""
    s3_only(s3)
    pytest.importorskip("torch")
    from tests.conftest import sigterm_group_after_steps

    out = outputs[0]["s3-s3"][1]
    env = _store_train_env(s3, out, tmp_path / "cache", 5.5)
    args = [a for s in [*TINY, "train.steps=300"] for a in ("--set", s)]

    def cmd(run: Path) -> list[str]:
        return [*TOKENMILL, "train", "--data", out, "--run-dir", str(run), *args]

    whole = subprocess.run(cmd(tmp_path / "whole"), env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert whole.returncode == 0, whole.stderr[-2000:]
    rc, err = sigterm_group_after_steps(cmd(tmp_path / "stopped"), tmp_path / "stopped", env=env, steps=5)
    assert rc == 143 and "stopped by SIGTERM" in err, err[-2000:]
    assert len(_losses(tmp_path / "stopped")) < 300, "the run ended before it was stopped"
    again = subprocess.run(cmd(tmp_path / "stopped"), env=env, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert again.returncode == 0 and "resumed from" in again.stderr, again.stderr[-2000:]
    want, got = _losses(tmp_path / "whole"), _losses(tmp_path / "stopped")
    assert [s for s, _ in got] == [s for s, _ in want] == list(range(1, 301))
    assert all(abs(a - b) < 1e-6 for (_, a), (_, b) in zip(got, want)), (got, want)
    tokenizer = json.loads(s3.get(out.split(s3.url(""), 1)[1] + "/manifest.json"))["tokenizer"]["sha256"]
    shards = [p for p in (tmp_path / "cache").iterdir() if len(p.name) == 64 and p.name != tokenizer]
    assert sum(p.stat().st_size for p in shards) <= float(env["TOKENMILL_CACHE_GB"]) * 2**30


def test_two_ranks_on_a_store_train_on_the_samples_of_one(s3, outputs, tmp_path):
    """torchrun, 2 ranks on s3:// with two lanes (each rank fetching its own shards) against one
    rank with grad_accum 2: the same samples make every step, so the losses agree; a cache too
    small for a rank's groups is one line before any step."""
    s3_only(s3)
    pytest.importorskip("torch")
    out = outputs[0]["s3-s3"][1]
    args = [a for s in [*TINY, "train.steps=8"] for a in ("--set", s)]
    one = tm("train", "--data", out, "--run-dir", str(tmp_path / "one"), *args, "--set", "train.grad_accum=2",
             env=_store_train_env(s3, out, tmp_path / "c1", 20))
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          "--no-python", *TOKENMILL[:1], "-m", "tokenmill.cli", "train", "--data", out, "--run-dir",
                          str(tmp_path / "two"), *args], env=_store_train_env(s3, out, tmp_path / "c2", 20),
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert two.returncode == 0, two.stderr[-2000:]
    a, b = _losses(tmp_path / "one"), _losses(tmp_path / "two")
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, 9))
    assert all(abs(x - y) < 1e-4 for (_, x), (_, y) in zip(a, b)), (a, b)
    small = tm("train", "--data", out, "--run-dir", str(tmp_path / "small"), *args,
               env=_store_train_env(s3, out, tmp_path / "c3", 1.5))
    assert small.returncode != 0 and "more than the local cache holds" in small.stderr, small.stderr[-2000:]
    assert "Traceback" not in small.stderr


def test_each_rank_fetches_only_its_own_shards_into_a_bounded_cache(s3, tmp_path, monkeypatch):
    """The library loader on an s3:// output with lanes (data.lanes): rank r of 2 fetches only the
    shards of its own lanes, each checked against the manifest; with a cache of about two shards
    the reads still give the bytes an unbounded cache gives (evicted shards are fetched again)."""
    pytest.importorskip("torch")
    import hashlib

    from tokenmill.data import PackedDataset
    from tokenmill.trainer.order import Order, deal_lanes

    out = s3.url("out/lanes")
    r = tm("prepare", "--input", str(REPO / "tokenmill" / "sample"), "--output", out, "--quiet",
           "--set", "shards.buckets=8")
    assert r.returncode == 0, r.stderr[-2000:]
    manifest = json.loads(s3.get("out/lanes/manifest.json"))
    shards = manifest["splits"]["train"]["shards"]
    assert len(shards) == 8
    lanes = deal_lanes(0, 0, 8, 2)

    def run(rank: int, cache: Path, limit_gb: str) -> list:
        monkeypatch.setenv("TOKENMILL_CACHE", str(cache))
        monkeypatch.setenv("TOKENMILL_CACHE_GB", limit_gb)
        ds = PackedDataset(out, seq_len=16, seed=0, rank=rank, world=2, batch_size=2, order=Order(1, 2, 2))
        items = iter(ds)
        got = [next(items)["tokens"] for _ in range(60)]
        return got

    fetched = []
    for rank in (0, 1):
        run(rank, tmp_path / f"cache{rank}", "50")
        blobs = {p.name for p in (tmp_path / f"cache{rank}").iterdir() if len(p.name) == 64}
        assert all(hashlib.sha256((tmp_path / f"cache{rank}" / b).read_bytes()).hexdigest() == b for b in blobs)
        mine = {shards[f]["sha256"] for f in lanes[rank]}
        train = blobs - {manifest["tokenizer"]["sha256"]} - {s["sha256"] for s in manifest["splits"]["val"]["shards"]}
        assert train and train <= mine, (rank, len(train), len(mine))
        fetched.append(train)
    assert not fetched[0] & fetched[1]
    biggest = max(s["bytes"] for s in shards)
    want = run(0, tmp_path / "cache0", "50")
    small = run(0, tmp_path / "small", str(2.5 * biggest / 2**30))
    assert all(a.equal(b) for a, b in zip(want, small))
    left = [p for p in (tmp_path / "small").iterdir() if len(p.name) == 64]
    assert sum(p.stat().st_size for p in left) <= 2.5 * biggest


def test_small_objects_are_fetched_ahead_and_read_as_without(s3):
    """readers.Prefetch over objects on the store: the records a reader gets are those of direct
    reads, and an object gone since the listing is one dropped row (not a failed task)."""
    from tokenmill.config import ReadConfig
    from tokenmill.transforms.readers import Prefetch, read_files, scan_inputs

    st_files = {f"ahead/p{i:02d}.html": f"<html><body><p>page {i} {'word ' * i}</p></body></html>".encode()
                for i in range(40)}
    from tokenmill.store import Store

    st = Store(s3.url("ahead/"))
    for key, data in st_files.items():
        st.write(s3.url(key), data)
    files = sorted(scan_inputs([s3.url("ahead/")]).files, key=lambda f: f.path)
    assert len(files) == 40
    cfg = ReadConfig()
    direct = list(read_files(files, cfg, Prefetch([])))
    with Prefetch(files) as ahead:
        fetched = list(read_files(files, cfg, ahead))
    assert fetched == direct and all(not d.get("dropped_by") for d in fetched)
    st.delete([s3.url("ahead/p07.html")])
    with Prefetch(files) as ahead:
        gone = list(read_files(files, cfg, ahead))
    assert len(gone) == 40 and [d["id"] for d in gone] == [d["id"] for d in direct]
    dropped = [d for d in gone if d.get("dropped_by")]
    assert len(dropped) == 1 and dropped[0]["id"].endswith("p07.html") and dropped[0]["dropped_by"].startswith("read:")
