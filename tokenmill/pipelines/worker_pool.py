"""A Beam worker pool (``--environment_type=EXTERNAL``) that several runners may share.

Beam's pool (``apache_beam.runners.worker.worker_pool_main``) keeps one SDK worker process per
worker id and stops a worker by its id alone. Worker ids are only unique within one runner
process: two Flink TaskManagers on one host both ask the host's pool for worker "4-1", the second
start forgets the first process, and the first TaskManager's StopWorker then kills the second's
worker mid-bundle (the job fails with "CANCELLED: client cancelled"; bench/MEASUREMENTS.md: worker
pool keyed by endpoint). This pool keys its workers by id *and* control endpoint,
stops only the workers whose runner has closed that endpoint (each worker also ends by itself when
its runner hangs up), and reaps every worker that ended (Beam's pool leaves them as zombies).

    python -m tokenmill.pipelines.worker_pool --service_port=50000 [--bind ADDRESS]

It listens on loopback unless ``--bind`` names another address: anyone who reaches the port can
have it start a worker against a control endpoint of their choosing, which then sends that
worker code to run. The runners that use it (a Flink TaskManager, a Spark executor) run on the
same host and reach it at ``localhost``; a wider address needs a network only trusted peers reach.

Every other behaviour (the command each worker runs, the Python on PATH that runs it) is Beam's.
"""

from __future__ import annotations

import argparse
import atexit
import logging
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlparse

from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.worker.worker_pool_main import (
    BeamFnExternalWorkerPoolServicer,
    kill_process_gracefully,
)


def _listening(url: str) -> bool:
    parsed = urlparse(url if "://" in url else f"//{url}")
    try:
        with socket.create_connection((parsed.hostname or "localhost", parsed.port), timeout=1):
            return True
    except OSError:
        return False


class SharedWorkerPool(BeamFnExternalWorkerPoolServicer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._workers: list[tuple[str, str, subprocess.Popen]] = []  # (worker id, control url, process)
        atexit.register(lambda: [kill_process_gracefully(w[2]) for w in self._workers if w[2].poll() is None])

    def _reap(self) -> None:
        with self._lock:
            self._workers = [w for w in self._workers if w[2].poll() is None]

    def StartWorker(self, request, context):
        self._reap()
        response = super().StartWorker(request, context)
        started = self._worker_processes.pop(request.worker_id, None)  # Beam's by-id record: not ours
        if started is not None:
            with self._lock:
                self._workers.append((request.worker_id, request.control_endpoint.url, started))
        return response

    def StopWorker(self, request, context):
        self._reap()
        with self._lock:
            mine = [w for w in self._workers if w[0] == request.worker_id]
        for _, url, proc in mine:
            if not _listening(url):  # its runner is gone; a live endpoint is another runner's worker
                kill_process_gracefully(proc)
        self._reap()
        return beam_fn_api_pb2.StopWorkerResponse()


def serve(bind: str, port: int):
    """The pool's gRPC server on ``bind``:``port`` (Beam's ``start`` listens on every interface)."""
    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.utils import thread_pool_executor

    server = grpc.server(thread_pool_executor.shared_unbounded_instance(),
                         options=[("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0)])
    host = f"[{bind}]" if ":" in bind and not bind.startswith("[") else bind
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # newer grpc raises where older ones returned 0
        bound = 0
    if not bound:
        sys.exit(f"tokenmill worker pool: cannot listen on {host}:{port} (taken, or not this host's address)")
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(SharedWorkerPool(use_process=True), server)
    server.start()
    return f"{host}:{bound}", server


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--service_port", type=int, required=True)
    ap.add_argument("--bind", default="localhost", help="address to listen on (default: loopback only)")
    args = ap.parse_args(argv)
    from tokenmill.terminal import SafeFormatter  # a failed bundle's log line may quote data

    handler = logging.StreamHandler()
    handler.setFormatter(SafeFormatter(logging.BASIC_FORMAT))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])
    address, server = serve(args.bind, args.service_port)
    print(f"tokenmill worker pool at {address}", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop(0)


if __name__ == "__main__":
    main()
