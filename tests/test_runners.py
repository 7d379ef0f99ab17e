"""The same pipeline on four local runners gives the same survivors, texts and shard bytes; one
of them is the path a cluster takes (SDK workers started by a separate worker pool)."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
from conftest import RUNNER_FLAGS, free_port, run_prepare

pytestmark = pytest.mark.slow  # every local runner mode, multi-process

RUNNERS = RUNNER_FLAGS


@contextlib.contextmanager
def worker_pool():
    """A Beam worker pool in its own process group, killed with its SDK workers afterwards."""
    port = free_port()
    # The pool starts each SDK worker as `python -c ...`: this interpreter must be the one found.
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                             f"--service_port={port}"], start_new_session=True, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, "the worker pool exited"
            with socket.socket() as s:
                if s.connect_ex(("localhost", port)) == 0:
                    break
            assert time.monotonic() < deadline, "the worker pool did not listen"
            time.sleep(0.1)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, flags in RUNNERS.items():
        d = tmp_path_factory.mktemp(name) / "out"
        with worker_pool() if "EXTERNAL" in " ".join(flags) else contextlib.nullcontext() as port:
            flags = [f.format(port=port) for f in flags]
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
        assert report["dedup"] == ref_report["dedup"], name
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["splits"] == ref_manifest["splits"], name
        for info in manifest["splits"].values():
            for s in info["shards"]:
                assert (d / s["file"]).read_bytes() == (ref_dir / s["file"]).read_bytes()


@pytest.mark.parametrize("flags, paths, refused", [
    # workers on another host, outside the launcher: a local path is their own disk
    (["--runner=FlinkRunner", "--flink_master=flink-host:8081", "--environment_type=EXTERNAL",
      "--environment_config=localhost:50000"], {"--output": ["out"]}, True),
    (["--runner=SparkRunner", "--spark_master_url=spark://spark-host:7077", "--environment_type=DOCKER"],
     {"--input": ["crawl/"], "--output": ["gs://b/out"]}, True),
    (["--runner=PortableRunner", "--job_endpoint=jobs.example:8099"], {"--output": ["/data/out"]}, True),
    # reachable: object stores, the cluster on this machine, or the Python stages in the launcher
    (["--runner=FlinkRunner", "--flink_master=flink-host:8081", "--environment_type=EXTERNAL",
      "--environment_config=localhost:50000"], {"--input": ["s3://b/in"], "--output": ["gs://b/out"]}, False),
    (["--runner=FlinkRunner", "--flink_master=localhost:8081", "--environment_type=EXTERNAL",
      "--environment_config=localhost:50000"], {"--output": ["out"]}, False),
    (["--runner=FlinkRunner", "--flink_master=flink-host:8081", "--environment_type=LOOPBACK"], {"--output": ["out"]}, False),
    (["--runner=SparkRunner"], {"--output": ["out"]}, False),  # local[4]
    ([], {"--output": ["out"]}, False),
])
def test_a_local_path_with_a_remote_cluster_is_one_line(flags, paths, refused):
    from tokenmill.errors import UserError
    from tokenmill.pipelines import launch

    options, runner = launch.beam_options(flags)
    if not refused:
        launch.check_paths_reach_workers(options, runner, paths)
        return
    with pytest.raises(UserError) as e:
        launch.check_paths_reach_workers(options, runner, paths)
    line = str(e.value)
    assert "\n" not in line and "this machine's disk" in line and ("-host" in line or "jobs.example" in line)


@pytest.mark.parametrize("setting", ["url.block_files", "decontaminate.files", "language.model",
                                     "quality.classifier.model"])
def test_a_local_file_a_worker_reads_is_named_before_submission(setting, tmp_path):
    """Every file a stage's workers open (Stage.reads), not only --input and --output: with a
    cluster on another host, a local one is refused in one line naming its setting."""
    from tokenmill.config import load_config
    from tokenmill.errors import UserError
    from tokenmill.pipelines import launch, prepare

    local = str(tmp_path / "file")
    value = f"[{local}]" if setting.endswith("files") else local
    cfg = load_config(None, [f"{setting}={value}"])
    cfg.inputs, cfg.output = ["s3://b/in"], "s3://b/out"
    assert prepare.worker_paths(cfg)[setting] == [local]
    options, runner = launch.beam_options(["--runner=FlinkRunner", "--flink_master=flink-host:8081",
                                           "--environment_type=EXTERNAL", "--environment_config=localhost:50000"])
    with pytest.raises(UserError) as e:
        launch.check_paths_reach_workers(options, runner, prepare.worker_paths(cfg))
    assert str(e.value).startswith(f"{setting} {local} is this machine's disk"), e.value
    cfg2 = load_config(None, [f"{setting}={value.replace(local, 's3://b/file')}"])
    cfg2.inputs, cfg2.output = ["s3://b/in"], "s3://b/out"
    launch.check_paths_reach_workers(options, runner, prepare.worker_paths(cfg2))


def test_a_worker_whose_extractor_is_another_build_stops_the_job(tmp_path):
    """The launcher's extractor identity travels with the extract step. A worker whose compiled
    walks differ (TOKENMILL_PURE_PYTHON=1: the Python twins, the same bytes) may join the job; one
    whose parsers differ (another selectolax or lxml, another tokenmill) refuses to start in one
    line. The manifest records the identity."""
    from tokenmill.config import ExtractConfig
    from tokenmill.errors import UserError
    from tokenmill.transforms.extract.extract_fn import ExtractFn
    from tokenmill.transforms.extract.tree import TEXT_DECIDING, identity

    fn = ExtractFn(ExtractConfig())
    assert fn.identity == identity()
    fn.setup()  # same build: fine
    other = subprocess.run([sys.executable, "-c", "import json; from tokenmill.transforms.extract.tree import identity; "
                            "print(json.dumps(identity()))"], capture_output=True, text=True, check=True,
                           env={**os.environ, "TOKENMILL_PURE_PYTHON": "1"})
    pure = json.loads(other.stdout)
    assert pure["compiled_walks"] == "none" and {k: pure[k] for k in TEXT_DECIDING} == {
        k: identity()[k] for k in TEXT_DECIDING}
    fn.identity = pure  # the launcher was the pure-Python build: the same text
    fn.setup()
    for key, value in [("selectolax", "0.3.17"), ("lxml", "4.9.0.0"), ("tokenmill", "0.0.1")]:
        fn.identity = {**identity(), key: value}  # a launcher whose parser is another version
        with pytest.raises(UserError) as e:
            fn.setup()
        assert "\n" not in str(e.value) and "differs from the launcher's" in str(e.value) and key in str(e.value)
    from conftest import REPO

    rc, _, _ = run_prepare(tmp_path / "out", [REPO / "tokenmill" / "sample" / "docs.jsonl"])
    assert rc == 0 and json.loads((tmp_path / "out" / "manifest.json").read_text())["extractor"] == identity()
