"""How a run is asked to stop: SIGTERM, and the rank that says so in its error lines."""

from __future__ import annotations

import os
import signal
import sys


class StopFlag:
    """SIGTERM (preemption, scancel) asks for a checkpoint at the end of the current step. A
    second SIGTERM (torchrun stopping the job because another rank failed, an impatient
    scheduler) ends the process at once: the checkpoint it would wait for may never come."""

    def __init__(self):
        self.set = False
        self._old = signal.signal(signal.SIGTERM, self._handle) if on_main_thread() else None

    def _handle(self, *_):
        if self.set:
            print(f"tokenmill: error: {rank_prefix()}stopped by a second SIGTERM before the checkpoint was saved",
                  file=sys.stderr, flush=True)
            os._exit(143)
        self.set = True

    def restore(self, failed: bool = False):
        """Back to the previous handler; after a failure, SIGTERM is ignored instead: torchrun
        sends it to every rank as soon as one fails, and the default action would kill this
        rank before it prints its own error line (the CLI restores the handler after that)."""
        if self._old is not None:
            signal.signal(signal.SIGTERM, signal.SIG_IGN if failed else self._old)


def on_main_thread() -> bool:
    """Signal handlers can only be set from the main thread (an in-process caller may not be on it)."""
    import threading

    return threading.current_thread() is threading.main_thread()


def rank_prefix() -> str:
    """``rank N: `` under a multi-rank launch, so each rank's own error line says whose it is."""
    return f"rank {os.environ.get('RANK', '0')}: " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
