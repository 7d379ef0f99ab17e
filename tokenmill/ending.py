"""How a Beam verb's process ends: its atexit handlers run (Beam stops the Flink or Spark job
server's JVM it started there), with stderr to /dev/null since the run's last line is said, and
then os._exit, under a watchdog."""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import sys
import threading

EXIT_HANDLERS_S = 20.0  # the most a Beam verb's process waits for its atexit handlers


def exit_after_handlers(code: int) -> None:
    """Runs the atexit handlers, then ends the process with ``code``; at EXIT_HANDLERS_S it ends
    anyway. A handler that never returns (one waiting on a lock held by one of Beam's threads,
    stopped mid-way by an interrupt) must not keep the process alive: a CI run saw a prepare hang
    after `tokenmill: interrupted` (bench/MEASUREMENTS.md: Beam verbs end within 20 s)."""
    watchdog = threading.Timer(EXIT_HANDLERS_S, os._exit, args=(code,))
    watchdog.daemon = True
    watchdog.start()
    # The watchdog needs the GIL; a handler stuck in C code holding it would stop it too: then
    # faulthandler's C thread writes every thread's stack and ends the process (exit code 1).
    faulthandler.dump_traceback_later(EXIT_HANDLERS_S + 10, exit=True, file=sys.__stderr__)
    sys.stdout.flush()
    sys.stderr.flush()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stderr(quiet):
        atexit._run_exitfuncs()
    os._exit(code)
