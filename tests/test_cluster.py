"""`prepare` on real clusters: a standalone Flink cluster (a JobManager and two TaskManagers), a
standalone Spark cluster (a Master and a Worker) and Prism, each as scripts/cluster.sh brings it
up. Every engine gives the in-process runner's rows, shards, manifest and report counts, byte for
byte; the engine's own REST API shows that the job ran there; a TaskManager killed mid-job costs a
restart, not a row; a job that fails on the cluster ends in one line.

Run by `make test-cluster` (which brings the engines up and down); skipped unless
TOKENMILL_CLUSTER=1, so `make test` stays fast."""

import contextlib
import json
import os
import shlex
import signal
import subprocess
import urllib.request
from pathlib import Path

import pytest
from conftest import prepare, read_output, reaped, run_prepare, snapshot, start_prepare, wait_for

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cluster.sh"
RUN = Path(os.environ.get("TOKENMILL_CLUSTER_HOME", ROOT / ".cluster")) / "run"
FLINK = f"http://localhost:{os.environ.get('FLINK_REST_PORT', '8081')}"
SPARK = f"http://127.0.0.1:{os.environ.get('SPARK_UI_PORT', '8080')}"
SPARK_DRIVER = "http://127.0.0.1:4040"  # the job server's SparkContext
SETS = ["tokenize.vocab_size=1000"]
SET_ARGS = [a for s in SETS for a in ("--set", s)]

pytestmark = pytest.mark.skipif(os.environ.get("TOKENMILL_CLUSTER") != "1",
                                reason="needs the local clusters: make test-cluster")


def flags(engine: str) -> list[str]:
    out = subprocess.run([str(SCRIPT), "flags", engine], check=True, capture_output=True, text=True).stdout
    return shlex.split(out)


def rest(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def flink_jobs() -> dict[str, dict]:
    return {j["jid"]: j for j in rest(f"{FLINK}/jobs/overview")["jobs"]}


def spark_apps() -> dict[str, dict]:
    return {a["id"]: a for a in rest(f"{SPARK}/json/")["completedapps"]}


def assert_same_output(out: Path, ref: Path, rows, report, ref_rows, ref_report):
    """Same docs rows; byte-identical shards and manifest; same report counts; and the same files
    under OUT, none more (no orphan from a retried bundle or a restarted job)."""
    key = lambda r: r["id"]  # noqa: E731
    assert sorted(rows, key=key) == sorted(ref_rows, key=key)
    for k in ("documents", "dropped_by", "dedup", "tokens", "languages"):
        assert report.get(k) == ref_report.get(k), k
    got, want = snapshot(out), snapshot(ref)  # every file but the lock (it holds a pid)
    assert sorted(got) == sorted(want)
    # byte for byte, but for the OUT path the manifest and report record
    unlike = {"manifest.json", "report/report.json"}
    assert {k: v for k, v in got.items() if k not in unlike} == {k: v for k, v in want.items() if k not in unlike}
    for name in ("manifest.json", "report/report.json"):
        mine = got[name].decode().replace(json.dumps(str(out))[1:-1], json.dumps(str(ref))[1:-1])
        assert json.loads(mine) == json.loads(want[name]), name


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("in_process") / "out"
    rc, rows, report = run_prepare(out, [], sets=SETS)
    assert rc == 0
    return out, rows, report


def assert_one_error_line(stderr: str, needle: str) -> None:
    err = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in err if ln.startswith("tokenmill: error:")]
    assert len(errors) == 1 and needle in errors[0], stderr
    # besides it, only what a remote run says while it runs: no traceback, no worker output
    assert all(ln.startswith(("tokenmill prepare: submitting", "Job state changed")) for ln in err
               if ln not in errors), stderr


def engine_run(engine, tmp_path, extra=()):
    out = tmp_path / "out"
    rc, rows, report = run_prepare(out, [], sets=SETS, extra=[*flags(engine), *extra])
    assert rc == 0, engine
    return out, rows, report


def test_flink_loopback_and_external_match_in_process(reference, tmp_path):
    ref, ref_rows, ref_report = reference
    for engine in ("flink", "flink-external"):
        before = flink_jobs()
        out, rows, report = engine_run(engine, tmp_path / engine)
        assert_same_output(out, ref, rows, report, ref_rows, ref_report)
        new = [j for jid, j in flink_jobs().items() if jid not in before]
        assert [j["state"] for j in new] == ["FINISHED"], engine  # it ran on the cluster
        assert new[0]["tasks"]["finished"] == new[0]["tasks"]["total"] > 0


def test_spark_matches_in_process(reference, tmp_path):
    ref, ref_rows, ref_report = reference
    before = spark_apps()
    out, rows, report = engine_run("spark", tmp_path)
    assert_same_output(out, ref, rows, report, ref_rows, ref_report)
    new = [a for aid, a in spark_apps().items() if aid not in before]
    assert [a["state"] for a in new] == ["FINISHED"]  # the Master ran it, on its Worker's executors
    assert new[0]["name"].startswith("BeamApp")


def prism_jobs() -> dict[tuple[str, str], str]:
    """(job port, job id) -> state of every job on each Prism running on this machine, from its
    own Job API (Prism serves no REST API when Beam starts it)."""
    import grpc
    from apache_beam.portability.api import beam_job_api_pb2 as api
    from apache_beam.portability.api import beam_job_api_pb2_grpc as api_grpc

    jobs = {}
    for _, argv in processes():
        if Path(argv[0]).name.startswith("prism") and "--job_port" in argv:
            port = argv[argv.index("--job_port") + 1]
            with grpc.insecure_channel(f"localhost:{port}") as channel:
                for job in api_grpc.JobServiceStub(channel).GetJobs(api.GetJobsRequest(), timeout=10).job_info:
                    jobs[port, job.job_id] = api.JobState.Enum.Name(job.state)
    return jobs


def test_prism_matches_in_process(reference, tmp_path):
    """Prism at cluster/versions.env's version (the 2.62 SDK's state channel now sends its worker
    id: tokenmill.pipelines.beamload.send_worker_id_on_state_channel)."""
    ref, ref_rows, ref_report = reference
    before = prism_jobs()
    out, rows, report = engine_run("prism", tmp_path)
    assert_same_output(out, ref, rows, report, ref_rows, ref_report)
    assert [state for job, state in prism_jobs().items() if job not in before] == ["DONE"]  # Prism ran it


def processes() -> list[tuple[int, list[str]]]:
    """(pid, argv) of every process on this machine."""
    found = []
    for p in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError):
            if p.name.isdigit():
                found.append((int(p.name), (p / "cmdline").read_bytes().decode().split("\0")))
    return found


def job_servers() -> set[int]:
    """The Beam job servers running on this machine: the Flink and Spark job-server JVMs, Prisms."""
    return {pid for pid, argv in processes()
            if any("-job-server-" in a for a in argv) or Path(argv[0]).name.startswith("prism")}


def _vertex_running(jid: str, name_part: str) -> bool:
    job = rest(f"{FLINK}/jobs/{jid}")
    return any(name_part in v["name"] and v["status"] == "RUNNING" for v in job["vertices"])


def test_flink_survives_a_lost_taskmanager(reference, tmp_path):
    """SIGKILL a TaskManager while the clean phase runs, start a new one: Flink restarts the job
    (config.yaml's fixed-delay strategy) and OUT is what an uninterrupted run writes."""
    ref, ref_rows, ref_report = reference
    out = tmp_path / "out"
    before = flink_jobs()
    jid = None
    try:
        with reaped(start_prepare(out, [], *SET_ARGS, *flags("flink"))) as proc:
            jid = wait_for(lambda: next((j for j in flink_jobs() if j not in before), None), 120, proc)
            wait_for(lambda: _vertex_running(jid, "Extract"), 120, proc)  # the clean phase
            victim = int((RUN / "flink" / "taskmanager-1.pid").read_text())
            os.kill(victim, signal.SIGKILL)
            subprocess.run([str(SCRIPT), "up", "flink"], check=True, capture_output=True)  # a new one
            assert int((RUN / "flink" / "taskmanager-1.pid").read_text()) != victim
            _, err = proc.communicate(timeout=300)
    finally:
        if jid and flink_jobs()[jid]["state"] not in ("FINISHED", "FAILED", "CANCELED"):
            urllib.request.urlopen(urllib.request.Request(f"{FLINK}/jobs/{jid}?mode=cancel", method="PATCH"))
    assert proc.returncode == 0, err[-3000:]
    job = rest(f"{FLINK}/jobs/{jid}")
    assert job["state"] == "FINISHED"
    history = rest(f"{FLINK}/jobs/{jid}/exceptions")["exceptionHistory"]["entries"]
    assert history, "the job was not restarted: the TaskManager died too late to matter"
    assert_same_output(out, ref, *read_output(out), ref_rows, ref_report)


def _executor_pids() -> list[int]:
    """The Spark Worker's executor JVMs (its children running CoarseGrainedExecutorBackend)."""
    worker = int((RUN / "spark" / "worker.pid").read_text())
    pids = []
    for p in Path("/proc").iterdir():
        try:
            stat = (p / "stat").read_text()
            cmd = (p / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == worker and b"CoarseGrainedExecutorBackend" in cmd:
            pids.append(int(p.name))
    return pids


def _spark_tasks_running() -> bool:
    try:
        apps = rest(f"{SPARK_DRIVER}/api/v1/applications")
        stages = rest(f"{SPARK_DRIVER}/api/v1/applications/{apps[0]['id']}/stages?status=active")
    except (OSError, ValueError, IndexError):
        return False
    return any(st["numActiveTasks"] > 0 for st in stages)


def test_spark_survives_a_lost_executor(reference, tmp_path):
    """SIGKILL the executor while the job's tasks run: the Worker starts a new one, Spark runs the
    lost tasks again, and OUT is what an uninterrupted run writes."""
    ref, ref_rows, ref_report = reference
    out = tmp_path / "out"
    before = spark_apps()
    with reaped(start_prepare(out, [], *SET_ARGS, *flags("spark"))) as proc:
        victims = wait_for(lambda: _spark_tasks_running() and _executor_pids(), 120, proc)
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    new = [a for aid, a in spark_apps().items() if aid not in before]
    assert [a["state"] for a in new] == ["FINISHED"]
    # the Worker's own record: the killed executor exited on SIGKILL, and a second one was launched
    app = new[0]["id"]
    log = (RUN / "spark" / "log" / "worker.out").read_text()
    assert f"Executor {app}/0 finished with state EXITED message Command exited with code 137" in log
    assert f"Asked to launch executor {app}/1 " in log
    assert_same_output(out, ref, *read_output(out), ref_rows, ref_report)


@pytest.mark.parametrize("engine", ["flink", "prism"])
def test_a_job_that_fails_on_the_cluster_is_one_line(engine, tmp_path):
    """A stage that raises on the cluster (a tokenizer with no unknown token meets a word it
    lacks) ends as on the local runners: one line naming the step, the previous output untouched.
    An input that cannot be read is refused by the launcher before anything is submitted."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"</s>": 0, "the": 1}))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "no_unk.json"))
    out = tmp_path / "out"
    assert prepare(out, [], *SET_ARGS, timeout=600)[0] == 0
    before, servers = snapshot(out), job_servers()
    failing = (["--set", "quality.enabled=false", "--set", f"tokenize.tokenizer={tmp_path / 'no_unk.json'}"],
               "the pipeline failed in step 'Finish'")
    # Prism 2.65 called 5 of 12 such jobs DONE (its bundle failure races the job's end): thrice
    for args, needle in [failing] * (3 if engine == "prism" else 1) + [
        (["--input", str(tmp_path / "missing.jsonl")], "missing.jsonl"),
    ]:
        rc, _, err = prepare(out, [], *args, *flags(engine), timeout=600)
        assert rc == 2
        assert_one_error_line(err, needle)
        assert snapshot(out) == before
        assert job_servers() <= servers  # the job server Beam started for the job ended with it


def test_no_engine_port_beyond_loopback(reference, tmp_path):
    """The engines' own daemons (found by their pid files) listen on loopback only; through a
    Flink EXTERNAL and a Spark run, so do the launcher's and the worker pool's Python processes.
    Beam 2.62's Java side is not held to it: its job-server jars and the Fn API servers it opens
    inside TaskManagers and executors bind every interface (no option says otherwise; README:
    What listens on the network)."""
    from netwatch import Watch, beyond_loopback

    def daemons() -> list[int]:
        found = []
        for f in RUN.rglob("*.pid"):
            with contextlib.suppress(ValueError, OSError):
                found.append(int(f.read_text().split()[0]))
        return found

    with Watch(daemons, every=0.2) as idle:  # (this process keeps the job servers of earlier tests)
        import time
        time.sleep(1)
    assert len(idle.seen) > 8 and not beyond_loopback(idle.seen), idle.by_name
    with Watch(lambda: [os.getpid(), *daemons()], every=0.2) as run:
        for engine in ("flink-external", "spark"):
            engine_run(engine, tmp_path / engine)
    python = {a for a in run.seen if "python" in run.by_name[a].split(" ", 1)[0]}
    assert python, run.by_name  # the sampler saw the launcher's servers
    wide = beyond_loopback(python)
    assert not wide, {a: run.by_name[a] for a in wide}
