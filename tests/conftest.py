import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = Path(os.environ.get("TOKENMILL_SHARED_DATA", REPO.parent / "shared" / "data"))


def shared(*parts: str) -> Path:
    """A path in ../shared/data, or skip the test when that folder is not on this machine."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"shared data not present: {p}")
    return p


def run_prepare(out: Path, inputs: list, sets: list[str] = (), extra: list[str] = ()) -> tuple[int, list[dict], dict]:
    """Run `tokenmill prepare` in-process on the DirectRunner; returns (exit code, doc rows, report)."""
    from tokenmill.cli import main

    argv = ["prepare", "--output", str(out)]
    for i in inputs:
        argv += ["--input", str(i)]
    for s in sets:
        argv += ["--set", s]
    rc = main(argv + list(extra))
    return rc, *read_output(out)


def read_output(out: Path) -> tuple[list[dict], dict]:
    """A prepare output's doc rows and report ({} without one)."""
    files = sorted(glob.glob(str(out / "docs" / "*.parquet")))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    report_path = out / "report" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return rows, report


def by_id(rows: list[dict]) -> dict[str, dict]:
    return {r["id"]: r for r in rows}


def read_all(path, cfg=None) -> list[dict]:
    """Every record the readers give for ``path`` (a file or folder), planned and read as a worker would."""
    from tokenmill.config import ReadConfig
    from tokenmill.transforms.readers import plan_units, read_unit, resolve_inputs

    cfg = cfg or ReadConfig()
    out = []
    for f in resolve_inputs([str(path)]):
        for unit in plan_units(f, cfg):
            out.extend([unit] if isinstance(unit, dict) else read_unit(unit, cfg))
    return out


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(not CHROMIUM, reason="headless Chromium not installed (apt-get install chromium)")


def render_in_chromium(page: Path, tmp_path: Path, height: int = 2400) -> str:
    """Open a page in headless Chromium as a person would: a screenshot that shows something, no
    console error; returns the page's DOM."""
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0"]
    shot = tmp_path / "page.png"
    run = subprocess.run(flags + [f"--window-size=1280,{height}", f"--screenshot={shot}", page.as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 30_000, run.stderr[-2000:]
    assert "CONSOLE" not in run.stderr and "Uncaught" not in run.stderr  # no console errors
    return subprocess.run(flags + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout


# ---------------------------------------------------------------- `tokenmill prepare` in its own process
# What a user sees on stderr includes what Beam and its worker processes log, which an in-process
# run under pytest would hide (test_hostile_prepare, test_cluster).

TOKENMILL = str(Path(sys.executable).with_name("tokenmill"))  # the venv's console script
if not os.path.exists(TOKENMILL):
    TOKENMILL = shutil.which("tokenmill") or TOKENMILL


def prepare(out: Path, inputs: list, *args: str, timeout: float = 120) -> tuple[int, str, str]:
    """`tokenmill prepare` in its own process: (exit code, stdout, stderr)."""
    argv = [TOKENMILL, "prepare", "--output", str(out)]
    for i in inputs:
        argv += ["--input", str(i)]
    p = subprocess.run(argv + list(args), capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def start_prepare(out: Path, inputs: list, *args: str) -> subprocess.Popen:
    """A prepare running in the background, in its own process group (as a terminal's job is)."""
    argv = [TOKENMILL, "prepare", "--output", str(out)]
    for i in inputs:
        argv += ["--input", str(i)]
    return subprocess.Popen(argv + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


@contextlib.contextmanager
def reaped(proc: subprocess.Popen):
    """Whatever a test asserts, a run it started does not outlive it."""
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_for(what, timeout: float = 60, proc: subprocess.Popen | None = None):
    """Poll ``what()`` until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        assert proc is None or proc.poll() is None, f"the run ended first: {proc.communicate()}"
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file under OUT and its bytes; the lock file holds the pid of the latest run."""
    from tokenmill.pipelines import output


    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != output.LOCK_NAME}




def sigterm_group_after_steps(cmd: list[str], run: Path, env: dict | None = None, steps: int = 3) -> tuple[int, str]:
    """Start a training command in a process group of its own, wait for ``steps`` rows in its
    metrics.jsonl, send SIGTERM to the whole group (as ``timeout``, ``scancel`` and Kubernetes do);
    returns (exit code, stderr)."""
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        metrics = run / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= steps):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err


# Every local runner mode, as a user names it; EXTERNAL's {port} is a worker pool's.
RUNNER_FLAGS = {
    "in_memory": ["--direct_running_mode=in_memory"],
    "multi_processing": ["--direct_running_mode=multi_processing", "--direct_num_workers=2"],
    "portable_loopback": ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"],
    # As Flink and Spark task managers run the Python stages: the worker image's --worker_pool
    # entrypoint starts this pool, and the runner asks it for SDK workers (EXTERNAL).
    "portable_external": ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
                          "--environment_config=localhost:{port}"],
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
