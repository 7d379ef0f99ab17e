"""How ``prepare`` runs its pipeline: Beam's options and runner checked before anything starts,
local multi_processing workers that leave Ctrl-C to the launcher (which ends them itself), and
a failed or interrupted run said in one line.
"""

from __future__ import annotations

import contextlib
import errno
import faulthandler
import io
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from urllib.parse import urlparse

from apache_beam.options.pipeline_options import (
    DirectOptions,
    PipelineOptions,
    PortableOptions,
    StandardOptions,
)
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.runner import PipelineRunner, create_runner
from apache_beam.transforms.environments import SubprocessSDKEnvironment

from tokenmill.credentials import LOCAL_RUNNERS  # (declared where Beam is not imported)
from tokenmill.errors import Terminated, UserError
from tokenmill.pipelines import warm


def beam_options(beam_args: list[str]) -> tuple[PipelineOptions, PipelineRunner]:
    """Beam's options, checked now: a bad flag value or an unknown runner is one line, not
    Beam's usage text or a traceback from deep inside the pipeline. Returns the options and the
    runner to run them with."""
    if not any(a == "--runner" or a.startswith("--runner=") for a in beam_args):
        # Beam's DirectRunner first tries Prism, a binary it downloads at run time; the FnApiRunner
        # it falls back to is the same in-process engine (honouring --direct_running_mode and
        # --direct_num_workers), with no download. It is also the fastest local mode here
        # (bench/MEASUREMENTS.md: FnApiRunner by default).
        beam_args = [*beam_args, "--runner=FnApiRunner"]
    options = PipelineOptions(beam_args)
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):  # argparse prints its usage, then exits
            options.get_all_options(retain_unknown_options=True)
    except SystemExit:
        said = [ln for ln in usage.getvalue().splitlines() if ": error: " in ln]
        raise UserError("Beam option: " + (said[-1].split(": error: ", 1)[1] if said else " ".join(beam_args))) from None
    name = options.view_as(StandardOptions).runner
    try:
        # apache-beam 2.62 (pinned: see cluster/versions.env) knows FnApiRunner only by its path
        runner = create_runner(_QUALIFIED.get(name, name))
    except (ValueError, ImportError) as e:
        raise UserError(f"--runner={name}: {str(e).splitlines()[0]}") from None
    return options, _local_workers(options, runner)


_QUALIFIED = {"FnApiRunner": "apache_beam.runners.portability.fn_api_runner.FnApiRunner"}


def is_local(options: PipelineOptions, runner: PipelineRunner) -> bool:
    """Whether the job's workers run on this machine (in-process, subprocesses, an embedded job
    server, a worker pool on localhost): only then can the launcher read their progress files."""
    name = type(runner).__name__
    if name in LOCAL_RUNNERS:
        return True
    if name == "PortableRunner":
        endpoint = options.get_all_options(retain_unknown_options=True).get("job_endpoint") or ""
        return endpoint == "embed" or endpoint.startswith(("localhost", "127.0.0.1", "[::1]"))
    return False


_LOCAL_HOSTS = ("", "localhost", "127.0.0.1", "::1", "[::1]")
# where a path on "this machine's disk" is also every worker's: network and cluster filesystems
_SHARED_FS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "ceph", "glusterfs", "beegfs", "9p", "fuse")


def cluster_host(options: PipelineOptions, runner: PipelineRunner) -> str:
    """The host of the cluster a job goes to ("" when it runs on this machine)."""
    name = type(runner).__name__
    if name in LOCAL_RUNNERS or not isinstance(runner, _portable_runner()):
        return ""
    opts = options.get_all_options(retain_unknown_options=True)
    address = {"FlinkRunner": opts.get("flink_master"), "SparkRunner": opts.get("spark_master_url")}.get(
        name, opts.get("job_endpoint"))
    if not address or address in ("[local]", "[auto]", "embed") or address.startswith("local"):
        return ""
    host = urlparse(address if "://" in address else f"//{address}").hostname or ""
    if host not in _LOCAL_HOSTS:
        return host
    # A master reached on this machine may still have its workers elsewhere (a tunnel, a
    # forwarded port): Flink's REST API names each TaskManager's own address.
    remote = [h for h in (flink_worker_hosts(address) if name == "FlinkRunner" else []) if not _is_loopback(h)]
    return remote[0] if remote else ""


def flink_worker_hosts(address: str) -> list[str]:
    """The addresses of a Flink cluster's TaskManagers, from its REST API at ``address`` (none
    where it does not answer: the runner says why when it submits)."""
    import http.client
    import json
    import urllib.request

    url = address if "://" in address else f"http://{address}"
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/taskmanagers", timeout=5) as r:
            managers = json.load(r).get("taskmanagers", [])
    except (OSError, ValueError, AttributeError, http.client.HTTPException):  # not Flink's REST API there
        return []
    # each one's RPC path: pekko.tcp://flink@ADDRESS:PORT/user/rpc/taskmanager_0
    found = (re.search(r"@(\[[^\]]+\]|[^:/@]+):\d+/", str(m.get("path", ""))) for m in managers if isinstance(m, dict))
    return sorted({m.group(1) for m in found if m})


def _is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine: loopback, or its own name or one of its addresses."""
    if host in _LOCAL_HOSTS or host.startswith("127."):
        return True
    import socket

    names = {socket.gethostname(), socket.getfqdn()}
    try:
        mine = {a for n in names for a in socket.gethostbyname_ex(n)[2]}
    except OSError:
        mine = set()
    return host in names or host in mine


def _portable_runner():
    from apache_beam.runners.portability.portable_runner import PortableRunner

    return PortableRunner


def harness_in_launcher(options: PipelineOptions, runner: PipelineRunner) -> bool:
    """Whether a portable job's Python stages run in this process (LOOPBACK; Prism's default)."""
    env = options.view_as(PortableOptions).environment_type
    return (env or ("LOOPBACK" if type(runner).__name__ == "PrismRunner" else "")).upper() == "LOOPBACK"


def _filesystem(path: str) -> str:
    """The type of the filesystem ``path`` (or its nearest existing parent) lives on, from /proc/mounts."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    best, kind = "", ""
    with contextlib.suppress(OSError), open("/proc/mounts") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) > 2 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")) \
                    and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    return kind


def check_paths_reach_workers(options: PipelineOptions, runner: PipelineRunner, paths: dict[str, list[str]]) -> None:
    """A job whose workers run on another host cannot read or write this machine's disk: a local
    path a worker opens (--input, --output, a model, a URL or decontamination list:
    prepare.worker_paths) is one line before anything is submitted, naming the setting (unless
    it is a network mount, or the Python stages run here: LOOPBACK)."""
    host = cluster_host(options, runner)
    if not host or harness_in_launcher(options, runner):
        return
    for flag, values in paths.items():
        for path in values:
            if "://" in path or _filesystem(path).startswith(_SHARED_FS):
                continue
            raise UserError(
                f"{flag} {path} is this machine's disk, but the job's workers run on {host}: give a path every "
                f"worker reaches (gs://, s3://, hdfs://, or a network mount at the same path on every host), "
                f"or run the Python stages here with --environment_type=LOOPBACK")


def _is_teardown(exc: BaseException) -> bool:
    # A runner ends each stage's SDK environment by closing its gRPC streams: the harness's reader
    # threads then die with CANCELLED, and a bundle still waiting for input with "Channel closed".
    code = getattr(exc, "code", None)
    return (callable(code) and getattr(code(), "name", "") == "CANCELLED") or "Channel closed prematurely" in str(exc)


def _lost_worker(exc: BaseException) -> bool:
    """What Beam's threads raise when a multi_processing worker process dies under them (killed by
    the kernel's OOM killer, say): the launcher's gRPC streams to it break, and the thread that
    watched it reports its exit."""
    return _is_fallout(exc) or "Worker subprocess exited" in str(exc)


def _is_fallout(exc: BaseException) -> bool:
    # Once the job has ended, a gRPC stream that breaks (a runner that went away, as a crashed
    # Prism does) is the end already reported, not news.
    import grpc

    return _is_teardown(exc) or isinstance(exc, grpc.RpcError) or "Socket closed" in str(exc)


@contextlib.contextmanager
def harness_output(options: PipelineOptions, runner: PipelineRunner):
    """For a job on a portable runner (Flink, Spark, Prism, a job server) whose Python stages run in
    the launcher (LOOPBACK): what Beam's SDK harness prints there (each failed bundle's traceback,
    again for every retry; the stream errors of each environment the runner tears down) goes to a
    log file instead of the user's terminal. Yields that file's path; it is removed after a run that
    succeeds, and kept (the one-line error names it) after one that fails."""
    if not (isinstance(runner, _portable_runner()) and harness_in_launcher(options, runner)):
        yield None
        return
    fd, path = tempfile.mkstemp(prefix="tokenmill-harness-", suffix=".log")
    log = os.fdopen(fd, "w", buffering=1, errors="replace")  # left open: harness threads outlive the job
    old_stderr, old_hook = sys.stderr, threading.excepthook

    def hook(args):
        if _is_teardown(args.exc_value):
            return
        import traceback

        traceback.print_exception(args.exc_type, args.exc_value, args.exc_traceback, file=log)

    sys.stderr, threading.excepthook = log, hook
    ok = False
    try:
        yield path
        ok = True
    finally:
        sys.stderr = old_stderr
        # The harness's threads outlive the job by a moment; what they say then is teardown too.
        threading.excepthook = lambda args: None if _is_fallout(args.exc_value) else old_hook(args)
        if ok:
            with contextlib.suppress(OSError):
                os.unlink(path)


def _chain(e: BaseException) -> list[BaseException]:
    chain, cause = [e], e
    while (cause := cause.__cause__ or cause.__context__) is not None and len(chain) < 20:
        chain.append(cause)
    return chain


def failure(e: BaseException, out: str, log: str | None = None) -> UserError:
    """One line for a pipeline that failed on a worker: disk full, or the step and its error
    (and where the SDK harness's full output went, for a LOOPBACK job on a portable runner)."""
    text = f"{type(e).__name__}: {e}"
    if any(isinstance(c, OSError) and c.errno == errno.ENOSPC for c in _chain(e)) or "No space left on device" in text:
        return UserError(f"disk full while writing {out}; the previous output is untouched")
    step = re.findall(r"\[while running '([^']+)'\]", text)
    if "Channel closed prematurely" in text or "Worker subprocess exited" in text:
        where = f" while running {step[-1].split('/')[0]!r}" if step else ""
        return UserError(f"a worker process died{where} (killed: if memory ran out, the kernel's OOM killer "
                         "ended it, as `dmesg` shows); lower --direct_num_workers or give the run more memory; "
                         f"the previous output in {out} is untouched")
    # gRPC's errors end in a line of their own repr (">"); what they say is in `details = "..."`
    details = re.findall(r'details = "([^"]*)"', text)
    lines = [ln.strip() for ln in text.splitlines()
             if re.search(r"\w", ln) and not ln.startswith((" ", "\t", "Traceback"))]
    last = details[-1] if details else lines[-1] if lines else type(e).__name__
    where = f" in step {step[-1].split('/')[0]!r}" if step else ""
    logged = f" (worker log: {log})" if log else ""
    return UserError(f"the pipeline failed{where}: {last[:500]}; the previous output in {out} is untouched{logged}")


def interrupted(e: BaseException) -> KeyboardInterrupt | None:
    """The interrupt behind ``e``, if any. Beam re-raises a KeyboardInterrupt from inside a step
    as RuntimeError("KeyboardInterrupt [while running ...]"), raised while it is handled."""
    return next((c for c in _chain(e) if isinstance(c, KeyboardInterrupt)), None)


def _local_workers(options: PipelineOptions, runner: PipelineRunner) -> PipelineRunner:
    """``runner``, except that FnApiRunner's multi_processing workers are started through
    tokenmill/pipelines/worker.py (Ctrl-C, stderr)."""
    direct = options.view_as(DirectOptions)
    if not isinstance(runner, FnApiRunner) or direct.direct_running_mode != "multi_processing":
        return runner
    env = SubprocessSDKEnvironment.from_command_string(warm.worker_command())
    # FnApiRunner picks Beam's worker command in multi_processing mode and keeps a given one
    # otherwise: the same workers (direct_num_workers of them), started our way.
    direct.direct_running_mode = "in_memory"
    return FnApiRunner(default_environment=env)


def processes() -> tuple[dict[int, int], dict[int, bytes]]:
    """Every process's parent pid and command line (NUL-separated), from /proc (Linux; empty
    elsewhere). A process that ends meanwhile is left out."""
    parent: dict[int, int] = {}
    cmd: dict[int, bytes] = {}
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return parent, cmd
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            with open(f"/proc/{pid}/stat", "rb") as fh:
                parent[pid] = int(fh.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd[pid] = fh.read()
    return parent, cmd


def end_workers() -> None:
    """SIGTERM to this process's multi_processing workers (Linux: found in /proc)."""
    me = os.getpid()
    parent, cmd = processes()
    mine, todo = set(), [me]
    while todo:  # descendants: Beam starts each worker through sh -c
        pid = todo.pop()
        kids = [p for p, pp in parent.items() if pp == pid and p not in mine]
        mine.update(kids)
        todo += kids
    for pid in mine:
        if warm.WORKER_MODULE.encode() in cmd.get(pid, b""):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)


THREAD_FAILURE_GRACE_S = 2.0  # how long a thread's failure waits for a signal that is on its way
UNWIND_DEADLINE_S = 30.0  # the most an interrupted run takes to unwind before it is ended


def _end_workers_until(unwound: threading.Event, every_s: float = 0.2) -> None:
    while not unwound.wait(every_s):
        end_workers()


@contextlib.contextmanager
def interruptible():
    """Ctrl-C (SIGINT) and SIGTERM end the run promptly. Beam's teardown waits for every
    multi_processing worker to finish its bundle, and one the launcher stopped feeding never
    finishes: the workers, which ignore SIGINT, are ended first, and any that Beam starts while
    it unwinds. What Beam's threads then raise about the workers they lost (gRPC stream errors,
    "Worker subprocess exited") is the interrupt's fallout, not news: after an interrupt, thread
    exceptions are not printed, for the rest of the process. A signal to the process group reaches
    the workers too, and the threads that watch them can fail before the main thread has run
    the handler (CI: "Exception in thread run_worker" after SIGTERM to the group): a thread's
    exception waits up to THREAD_FAILURE_GRACE_S for the interrupt before it is printed (no
    longer than the run: one that unwinds without a signal prints it before it goes on).
    SIGTERM raises Terminated, a KeyboardInterrupt. Once interrupted, the run has UNWIND_DEADLINE_S
    to unwind: past it, faulthandler (a C thread: it needs no lock of Python's) writes every
    thread's stack to stderr and ends the process (exit code 1), so that a stuck teardown is a
    report, not a hang."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signalled = threading.Event()
    unwound = threading.Event()

    def on_signal(signum, frame):
        if not signalled.is_set():
            # Beam may start a worker after this (a bundle was being scheduled), and its teardown
            # waits for every worker it started: a late one, which would wait for work forever
            # (a stress run of 40 interrupts hung once so), is ended too, until the run has unwound.
            threading.Thread(target=_end_workers_until, args=(unwound,), name="tokenmill-end-workers",
                             daemon=True).start()
            faulthandler.dump_traceback_later(UNWIND_DEADLINE_S, exit=True, file=sys.__stderr__)
        signalled.set()
        end_workers()
        raise Terminated if signum == signal.SIGTERM else KeyboardInterrupt

    waiting: list[threading.Event] = []  # the thread failures that wait for a signal

    def hook(args):
        if _lost_worker(args.exc_value):  # a worker died under Beam's threads: the run fails and its line says so
            return
        done = threading.Event()
        waiting.append(done)
        give_up = time.monotonic() + THREAD_FAILURE_GRACE_S
        try:
            while not signalled.wait(0.05):
                if unwound.is_set() or time.monotonic() >= give_up:  # none came: it is news
                    old_hook(args)
                    return
        finally:
            done.set()

    old_int, old_term = signal.signal(signal.SIGINT, on_signal), signal.signal(signal.SIGTERM, on_signal)
    old_hook = threading.excepthook
    threading.excepthook = hook
    try:
        yield
    finally:
        unwound.set()
        if signalled.is_set():
            faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        if not signalled.is_set():  # Beam's threads may still be failing after the run has unwound
            threading.excepthook = lambda args: None if _lost_worker(args.exc_value) else old_hook(args)
            for done in list(waiting):  # a failure that waited is printed before the run's own line
                done.wait(1.0)


@contextlib.contextmanager
def sigint_ignored():
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old_handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_handler)


def announce_remote(options: PipelineOptions) -> None:
    """A remote runner's job is watched where it runs: say so, and let the runner's own lines
    with the job id and console URL through (tokenmill otherwise silences Beam's logging)."""
    from tokenmill.terminal import SafeFormatter, safe  # `tokenmill prepare` on a remote runner

    runner = str(options.view_as(StandardOptions).runner)
    opts = options.get_all_options(retain_unknown_options=True)
    # Beam's Flink and Spark job servers print no console URL: the engines' own web UIs
    where = {"FlinkRunner": f"watch it at http://{opts.get('flink_master')}/#/job/running; its state follows",
             "SparkRunner": f"watch it on {opts.get('spark_master_url')}'s web UI (port 8080 by default); "
                            "its state follows"
             if str(opts.get("spark_master_url", "")).startswith("spark://") else None}.get(runner)
    print(safe(f"tokenmill prepare: submitting to {runner}; {where or 'the job id and where to watch it follow'}"),
          file=sys.stderr)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(SafeFormatter("%(message)s"))
    handler.set_name("tokenmill-remote")
    # ... but not its advice to run the pipeline in a `with` block, which prepare does
    handler.addFilter(lambda r: not str(r.msg).startswith('Environment "'))
    for name in ("apache_beam.runners.dataflow", "apache_beam.runners.portability.portable_runner"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.handlers = [h for h in logger.handlers if h.get_name() != "tokenmill-remote"] + [handler]
        logger.propagate = False
