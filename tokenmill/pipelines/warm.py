"""Warm multi_processing workers. FnApiRunner starts its SDK workers at the job's first bundle,
after the launcher has imported Beam and built the graph, and each worker then spends a
while importing Beam and tokenmill before it can take work (bench/MEASUREMENTS.md: warm
workers). Started here, before the
launcher's own imports, the workers import while the launcher does: that start-up leaves the
critical path of every job (it is most of ``refilter``'s fixed cost).

FnApiRunner still starts "its" workers through a command (launch._local_workers). With warm
workers that command is a small attach process (``worker.py --attach FOLDER``): it claims a warm
worker, hands it its environment (the runner's control address, the job's options, the worker
id) over the worker's Unix socket, and waits for it to end. With no warm worker to claim it
becomes a cold worker itself. This module imports nothing of Beam.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

WORKER_MODULE = "tokenmill.pipelines.worker"
CONNECT_S = 20.0  # how long an attach waits for its claimed worker's socket to appear


class Warm:
    """N warm workers waiting in ``folder`` (``<i>.sock``; ``<i>.claim`` once attached)."""

    def __init__(self, folder: str, procs: list[subprocess.Popen]):
        self.folder, self.procs = folder, procs

    def close(self) -> None:
        """Reaps the workers a job attached to (they end with it), ends the others (a job that
        failed before its first bundle, one that ran fewer workers, a claim whose attach never
        connected), and removes the folder."""
        for i, proc in enumerate(self.procs):
            if os.path.exists(os.path.join(self.folder, f"{i}.claim")):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_current: Warm | None = None


def preload() -> None:
    """What a worker would otherwise do on its first bundle, done while it waits for the job
    (the launcher is still building the graph): pyarrow's first array from Python values asks
    whether pandas is installed, importing it where it is (0.3 s; bench/MEASUREMENTS.md: warm
    workers preload)."""
    import pyarrow as pa

    pa.array([0])


def workers_wanted(beam_args: list[str]) -> int:
    """How many SDK worker processes FnApiRunner will start for these Beam flags (0: none, the
    job runs in-process or on another runner)."""
    ap = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    ap.add_argument("--runner")
    ap.add_argument("--direct_running_mode", default="in_memory")
    ap.add_argument("--direct_num_workers", default="1")
    try:
        known, _ = ap.parse_known_args(beam_args)
        n = int(known.direct_num_workers)
    except (SystemExit, ValueError):  # a bad flag: Beam says so itself, in one line (launch)
        return 0
    if known.runner not in (None, "FnApiRunner") or known.direct_running_mode != "multi_processing" or n < 0:
        return 0
    return n or (os.cpu_count() or 1)


def start(beam_args: list[str]) -> Warm | None:
    """Starts the job's workers now when it will run multi_processing (else None)."""
    global _current
    stop()
    n = workers_wanted(beam_args)
    if not n:
        return None
    folder = tempfile.mkdtemp(prefix="tokenmill-workers-")
    main = threading.current_thread() is threading.main_thread()  # only there can signals be set
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None  # inherited: as the cold workers' command
    try:
        procs = [subprocess.Popen([sys.executable, "-m", WORKER_MODULE, "--warm", os.path.join(folder, f"{i}.sock")],
                                  stdin=subprocess.DEVNULL) for i in range(n)]
    finally:
        if main:
            signal.signal(signal.SIGINT, old)
    _current = Warm(folder, procs)
    return _current


def worker_command() -> str:
    """FnApiRunner's command for a worker: an attach process when warm workers wait, else a cold
    worker. Run by sh -c: a SIGINT ignored before exec stays ignored, and Python then installs no
    KeyboardInterrupt handler, so a Ctrl-C during its start-up is ignored too (the launcher ends
    the workers itself)."""
    cmd = f"trap '' INT; exec {shlex.quote(sys.executable)} -m {WORKER_MODULE}"
    if _current is None:
        return cmd
    return f"{cmd} --attach {shlex.quote(_current.folder)} {len(_current.procs)}"


def stop() -> None:
    global _current
    if _current is not None:
        _current.close()
        _current = None


# ---------------------------------------------------------------- the worker's side


def listen(path: str) -> socket.socket:
    """A warm worker's first step, before its imports: its socket, so that an attach finds it."""
    with contextlib.suppress(OSError, AttributeError):  # Linux: end with the launcher, whatever kills it
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)
    return srv


def wait_for_job(srv: socket.socket) -> socket.socket:
    """Blocks until an attach hands over its environment, which becomes this process's; returns
    the connection, to be told this worker's end (``done``)."""
    conn, _ = srv.accept()
    srv.close()
    data = b""
    while not data.endswith(b"\n"):
        chunk = conn.recv(65536)
        if not chunk:
            raise SystemExit("tokenmill worker: the attach process left before its environment came")
        data += chunk
    os.environ.update(json.loads(data))
    return conn


def done(conn: socket.socket) -> None:
    """The harness returned normally: the attach process exits 0 (a worker that dies sends
    nothing, and its attach exits 1, which FnApiRunner reports)."""
    with contextlib.suppress(OSError):
        conn.sendall(b"0")


def attach(folder: str, n: int) -> int:
    """The attach process: claim one of the ``n`` warm workers, hand it this environment, wait
    for its end. With none left to claim, or one whose socket never came, this process becomes a
    cold worker."""
    for i in range(n):
        try:  # O_EXCL: of two attach processes, one claims worker i
            os.close(os.open(os.path.join(folder, f"{i}.claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue
        except OSError:
            break
        conn = _connect(os.path.join(folder, f"{i}.sock"))
        if conn is None:
            break
        conn.sendall(json.dumps(dict(os.environ)).encode("utf-8") + b"\n")
        return 0 if conn.recv(1) == b"0" else 1
    os.execv(sys.executable, [sys.executable, "-m", WORKER_MODULE])
    return 1  # not reached


def _connect(path: str) -> socket.socket | None:
    deadline = time.monotonic() + CONNECT_S
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            return conn
        except OSError:
            conn.close()
            if time.monotonic() > deadline:
                return None
            time.sleep(0.02)
