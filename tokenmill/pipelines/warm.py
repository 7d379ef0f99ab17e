"""Warm multi_processing workers. FnApiRunner starts its SDK workers at the job's first bundle,
after the launcher has imported Beam and built the graph, and each worker then spends a
while importing Beam and tokenmill before it can take work (bench/MEASUREMENTS.md: warm
workers). Started here, before the
launcher's own imports, the workers import while the launcher does: that start-up leaves the
critical path of every job (it is most of ``refilter``'s fixed cost).

The workers are forked from one process (``worker.py --warm FOLDER N``) once it has imported Beam
and tokenmill: the imports are done once, not once per worker, and the launcher has a core to
itself while it builds the graph (bench/MEASUREMENTS.md: warm workers forked). That process binds
every worker's socket first, then forks a worker per socket and becomes a small process that
reaps them; its workers end with it (PR_SET_PDEATHSIG), and it ends with the launcher.

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
    """N warm workers waiting in ``folder`` (``<i>.sock``; ``<i>.claim`` once attached), forked
    from ``proc``."""

    def __init__(self, folder: str, n: int, proc: subprocess.Popen):
        self.folder, self.n, self.proc = folder, n, proc

    def close(self) -> None:
        """Lets the workers a job attached to end with it, dismisses the others (a job that ran
        fewer workers, one that failed before its first bundle), and removes the folder. With no
        worker claimed, or a claim whose attach never connected, their process is ended: its
        workers end with it."""
        claimed = False
        for i in range(self.n):
            mine = _claim(self.folder, i)
            if mine:
                _dismiss(os.path.join(self.folder, f"{i}.sock"))
            claimed = claimed or mine is False
        if claimed:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
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
        proc = subprocess.Popen([sys.executable, "-m", WORKER_MODULE, "--warm", folder, str(n)], stdin=subprocess.DEVNULL)
    finally:
        if main:
            signal.signal(signal.SIGINT, old)
    _current = Warm(folder, n, proc)
    return _current


def worker_command() -> str:
    """FnApiRunner's command for a worker: an attach process when warm workers wait, else a cold
    worker. Run by sh -c: a SIGINT ignored before exec stays ignored, and Python then installs no
    KeyboardInterrupt handler, so a Ctrl-C during its start-up is ignored too (the launcher ends
    the workers itself)."""
    cmd = f"trap '' INT; exec {shlex.quote(sys.executable)} -m {WORKER_MODULE}"
    if _current is None:
        return cmd
    return f"{cmd} --attach {shlex.quote(_current.folder)} {_current.n}"


def stop() -> None:
    global _current
    if _current is not None:
        _current.close()
        _current = None


# ---------------------------------------------------------------- the worker's side


def _end_with_parent() -> None:
    """This process gets SIGTERM when its parent ends, whatever ends it (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def listen(folder: str, n: int) -> list[socket.socket]:
    """The warm process's first step, before its imports: every worker's socket, so that an
    attach finds it."""
    _end_with_parent()
    socks = []
    for i in range(n):
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(os.path.join(folder, f"{i}.sock"))
        srv.listen(1)
        socks.append(srv)
    return socks


# What the forking process becomes once its workers are forked: a bare Python (-I -S: no site,
# ~10 MB) that reaps them and exits, 0 when every one did. It keeps its pid, so the workers stay
# its children (and end with it), and keeps WORKER_MODULE in its command line (end_workers).
_REAPER = """import os
failed = 0
while True:
    try:
        failed = failed or os.wait()[1]
    except ChildProcessError:
        break
os._exit(1 if failed else 0)
"""


def fork_workers(socks: list[socket.socket]) -> socket.socket:
    """Forks a worker per socket; returns in each worker with its socket. This process then
    becomes a small reaper of its workers (exec): what it imported would otherwise stay in memory
    for the whole job, counted once more in the process tree's RSS."""
    parent = os.getpid()
    for srv in socks:
        if os.fork() == 0:
            _end_with_parent()
            if os.getppid() != parent:  # the parent ended before the line above
                os._exit(1)
            for other in socks:
                if other is not srv:
                    other.close()
            return srv
    for srv in socks:
        srv.close()
    os.execv(sys.executable, [sys.executable, "-I", "-S", "-c", _REAPER, WORKER_MODULE])
    raise AssertionError("not reached")


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
    env = json.loads(data)
    if env is None:  # dismissed: the job needs no more workers
        os._exit(0)
    os.environ.update(env)
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
        claimed = _claim(folder, i)
        if claimed is None:
            break
        if not claimed:
            continue
        conn = _connect(os.path.join(folder, f"{i}.sock"))
        if conn is None:
            break
        conn.sendall(json.dumps(dict(os.environ)).encode("utf-8") + b"\n")
        return 0 if conn.recv(1) == b"0" else 1
    os.execv(sys.executable, [sys.executable, "-m", WORKER_MODULE])
    return 1  # not reached


def _claim(folder: str, i: int) -> bool | None:
    """Claims worker i (O_EXCL: of two claims, one wins); None when the folder is gone."""
    try:
        os.close(os.open(os.path.join(folder, f"{i}.claim"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False
    except OSError:
        return None


def _dismiss(path: str) -> None:
    """Tells an unclaimed worker it will get no job (it exits); nothing when it is not listening."""
    with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(1.0)
        conn.connect(path)
        conn.sendall(b"null\n")


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
