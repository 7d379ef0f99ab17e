"""Nothing tokenmill starts listens beyond loopback unless the user names the address: the
listening sockets of each local runner's whole process tree, sampled through a run, the worker
pool of the EXTERNAL environment, and the store servers of scripts/cluster.sh. (The clusters'
ports: tests/test_cluster.py.)"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from netwatch import Watch, beyond_loopback, listening

from tests.conftest import REPO, RUNNER_FLAGS, free_port

pytestmark = pytest.mark.slow  # a prepare a runner mode
SAMPLE = REPO / "tokenmill" / "sample"
TOKENMILL = [sys.executable, "-m", "tokenmill.cli"]

MODES = RUNNER_FLAGS  # in_memory starts no gRPC server


def _pool(port: int, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.Popen([sys.executable, "-m", "tokenmill.pipelines.worker_pool", f"--service_port={port}", *extra],
                            start_new_session=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not listening({proc.pid}):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert time.monotonic() < deadline, "the worker pool did not listen"
        time.sleep(0.1)
    return proc


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("mode", list(MODES))
def test_no_port_beyond_loopback_during_a_run(mode, tmp_path):
    pool = _pool(port := free_port()) if mode == "portable_external" else None
    flags = [f.format(port=port) if pool else f for f in MODES[mode]]
    try:
        proc = subprocess.Popen([*TOKENMILL, "prepare", "--input", str(SAMPLE), "--output", str(tmp_path / "out"),
                                 "--quiet", *flags], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        with Watch(proc.pid) as run, (Watch(pool.pid) if pool else Watch(proc.pid)) as workers:
            err = proc.communicate(timeout=600)[1].decode()
        assert proc.returncode == 0, err[-2000:]
    finally:
        if pool:
            _stop(pool)
    seen = run.seen | workers.seen
    if mode != "in_memory":
        assert seen, "the sampler saw no server of the run"  # it would pass any run otherwise
    assert not beyond_loopback(seen), sorted(seen)


def test_the_worker_pool_listens_where_it_is_told():
    port = free_port()
    pool = _pool(port)
    try:
        assert listening({pool.pid}) and not beyond_loopback(listening({pool.pid}))
    finally:
        _stop(pool)
    port = free_port()
    addr = next((a for a in _own_addresses() if not a.startswith("127.")), None)
    if addr is None:
        pytest.skip("this machine has no address but loopback")
    pool = _pool(port, f"--bind={addr}")
    try:
        assert listening({pool.pid}) == {f"{addr}:{port}"}
    finally:
        _stop(pool)


def _own_addresses() -> list[str]:
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    return [a for a in out if ":" not in a]


@pytest.mark.parametrize("kind", ["s3", "gcs"])
def test_the_store_servers_listen_on_loopback(kind, tmp_path):
    from test_object_store import Server, _binary

    if not _binary(kind).exists():
        pytest.skip(f"the {kind} server is not built (scripts/cluster.sh install {kind})")
    server = Server(kind, tmp_path)
    server.up()
    try:
        pid = int(Path(tmp_path / f"{kind}.pid").read_text())
        seen = listening({pid})
        assert f"127.0.0.1:{server.port}" in seen and not beyond_loopback(seen), seen
    finally:
        server.down()
