import glob
import json
import os
import shutil
import subprocess
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
    files = sorted(glob.glob(str(out / "docs" / "*.parquet")))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    report_path = out / "report" / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() else {}
    return rc, rows, report


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
