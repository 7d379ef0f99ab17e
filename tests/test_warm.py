"""Warm multi_processing workers (pipelines/warm.py): started before the launcher loads Beam, then
claimed by FnApiRunner's attach processes; a job with more workers than warm ones starts the rest
cold. The output is the same either way, and nothing is left behind."""

import os
import time

import pyarrow.parquet as pq
import pytest

from tokenmill.pipelines import warm

pytestmark = pytest.mark.slow  # multi_processing workers started and ended

MULTI = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]


@pytest.mark.parametrize("args, n", [
    ([], 0),
    (["--direct_running_mode=in_memory"], 0),
    (MULTI, 2),
    (["--direct_running_mode", "multi_processing", "--direct_num_workers", "3"], 3),
    (["--direct_running_mode=multi_processing"], 1),  # Beam's default: one worker
    (["--direct_running_mode=multi_processing", "--direct_num_workers=0"], os.cpu_count()),  # Beam: one per CPU
    ([*MULTI, "--runner=FnApiRunner"], 2),
    ([*MULTI, "--runner=PortableRunner"], 0),  # its workers are not FnApiRunner's subprocesses
    (["--direct_running_mode=multi_processing", "--direct_num_workers=two"], 0),  # Beam says so itself
])
def test_workers_wanted(args, n):
    assert warm.workers_wanted(args) == n


def test_unclaimed_workers_end_with_the_launchers_job():
    started = warm.start(MULTI)
    try:
        assert started is not None and started.n == 2
        assert warm.worker_command().endswith(f"--attach {started.folder} 2")
    finally:
        warm.stop()
    assert started.proc.poll() is not None
    assert not os.path.exists(started.folder)
    assert "--attach" not in warm.worker_command()  # a cold worker again


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
def test_the_workers_are_forked_and_their_parent_keeps_no_imports():
    """One process imports, forks a worker per socket, and becomes a small reaper: its imports
    would otherwise be counted again in the job's memory."""
    started = warm.start(MULTI)
    try:
        pid, deadline = started.proc.pid, time.monotonic() + 120
        while b"-S" not in open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0"):
            assert time.monotonic() < deadline, "the warm process never forked its workers"
            time.sleep(0.1)
        status = open(f"/proc/{pid}/status").read()
        assert int(status.split("VmRSS:")[1].split()[0]) < 40_000  # kB: a bare Python, not Beam's
        from tokenmill.pipelines.launch import processes

        parent, cmd = processes()
        kids = [p for p, pp in parent.items() if pp == pid]
        assert len(kids) == 2
        assert all(warm.WORKER_MODULE.encode() in cmd[k] for k in kids)
    finally:
        warm.stop()
    assert started.proc.poll() is not None and not os.path.exists(started.folder)


def test_a_claimed_worker_whose_job_never_came_is_ended_too():
    started = warm.start(MULTI)
    try:  # an attach that claimed worker 0 and died before it connected
        open(os.path.join(started.folder, "0.claim"), "w").close()
    finally:
        warm.stop()
    assert started.proc.poll() is not None
    assert not os.path.exists(started.folder)


def _rows(out):
    files = sorted(f for f in os.listdir(out / "docs") if f.endswith(".parquet"))
    return {f: pq.read_table(out / "docs" / f).to_pylist() for f in files}


@pytest.mark.parametrize("n_warm, n_job", [(1, 2), (2, 1)])
def test_warm_and_cold_workers_in_one_job_give_the_same_output(tmp_path, n_warm, n_job):
    """One warm worker for a two-worker job: the first attach claims it, the second finds none
    and becomes a cold worker. Two warm workers for a one-worker job: the one no job took is
    dismissed, and their process ends on its own (not killed). Docs and shards equal an
    in-process run's, byte for byte."""
    from tokenmill.cli import _load_beam, sample_inputs
    from tokenmill.config import load_config

    _load_beam()
    from tokenmill.pipelines import prepare

    outs = {}
    job = ["--direct_running_mode=multi_processing", f"--direct_num_workers={n_job}"]
    for name, args in (("in_memory", ["--direct_running_mode=in_memory"]), ("mixed", job)):
        cfg = load_config(None, ["tokenize.vocab_size=1000"])
        cfg.inputs, cfg.output = sample_inputs(), str(tmp_path / name)
        warm_args = ["--direct_running_mode=multi_processing", f"--direct_num_workers={n_warm}"]
        started = warm.start(warm_args) if name == "mixed" else None
        try:
            prepare.run(cfg, args)
        finally:
            warm.stop()
        if started:
            assert os.path.exists(started.folder) is False
            assert started.proc.returncode == 0  # claimed, ran, ended on its own
        outs[name] = tmp_path / name
    assert _rows(outs["mixed"]) == _rows(outs["in_memory"])
    shards = sorted(os.listdir(outs["in_memory"] / "shards"))
    assert shards == sorted(os.listdir(outs["mixed"] / "shards")) and shards
    for s in shards:
        assert (outs["mixed"] / "shards" / s).read_bytes() == (outs["in_memory"] / "shards" / s).read_bytes()
