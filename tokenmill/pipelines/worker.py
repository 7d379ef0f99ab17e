"""The SDK worker process of ``--direct_running_mode=multi_processing``: Beam's own
(``apache_beam.runners.worker.sdk_worker_main``), started the way the launcher needs it
(launch._local_workers).

* Ctrl-C reaches every process of the terminal's process group, the workers too. The launcher
  handles it (one line, the stage folder removed) and ends its workers itself (SIGTERM); a worker
  that took it would print a KeyboardInterrupt traceback, wherever it was (often mid-import).
  The launcher's command ignores SIGINT before exec already, so Python never installs its
  handler; ignoring it here as well covers a worker started some other way.
* Started with ``--warm FOLDER N``, it loads Beam and tokenmill first, then forks N workers that
  each wait for a job's environment from an attach process (``--attach``; see warm.py).
* Beam is loaded without its unused optional modules (beamload): a shorter start for every
  worker. A worker started another way (Dataflow's harness, a worker pool) is unchanged.
* Once the harness returns (the runner closed the control channel), every bundle is committed
  and Beam's log channel closed: the worker ends with os._exit. Python's own teardown, with
  Beam, gRPC and the tokenizers loaded, is slow, and the launcher would wait for it at the end
  of every job (bench/MEASUREMENTS.md: workers end with os._exit).
* Beam's worker logs at INFO to stderr (and prints a failed bundle's traceback there); the
  launcher already reports a failed bundle in one line. Its stderr keeps what the launcher
  shows too: tokenmill's warnings and real errors. Every record still reaches the launcher
  through the Fn API logging channel.
"""

from __future__ import annotations

import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)

import logging  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402


def _shown(record: logging.LogRecord) -> bool:
    if record.name == "tokenmill" or record.name.startswith("tokenmill."):
        return record.levelno >= logging.WARNING
    if record.name.startswith("apache_beam"):  # a failed bundle: the launcher says it in one line
        return record.levelno >= logging.CRITICAL
    return record.levelno >= logging.ERROR


def main() -> None:
    socks = None
    if sys.argv[1:2] == ["--attach"]:  # FnApiRunner's worker command when warm workers wait (warm)
        from tokenmill.pipelines import warm

        sys.exit(warm.attach(sys.argv[2], int(sys.argv[3])))
    if sys.argv[1:2] == ["--warm"]:
        from tokenmill.pipelines import warm

        socks = warm.listen(sys.argv[2], int(sys.argv[3]))
    # Before Beam's imports: one of them logs a warning on the root logger, which would give it
    # a handler printing everything Beam logs at INFO.
    handler = logging.StreamHandler(os.fdopen(os.dup(2), "w", buffering=1))
    from tokenmill.terminal import SafeFormatter  # a warning quotes input file names and parse errors

    handler.setFormatter(SafeFormatter("%(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_shown)
    logging.getLogger().addHandler(handler)
    # Beam prints the traceback of a failed bundle straight to sys.stderr, besides logging it.
    sys.stderr = open(os.devnull, "w")  # for the life of the process

    from tokenmill.pipelines.beamload import import_lean

    harness = import_lean("apache_beam.runners.worker.sdk_worker_main")
    conn = None
    if socks is not None:
        import tokenmill.pipelines.prepare  # noqa: F401 - what the job's steps need, while waiting

        warm.preload()
        conn = warm.wait_for_job(warm.fork_workers(socks))
    harness.main(sys.argv)
    if conn is not None:
        warm.done(conn)
    logging.shutdown()
    os._exit(0)


if __name__ == "__main__":
    main()
