"""Beam loaded without the optional modules it imports at its own import for features tokenmill
does not use: pandas (its DataFrame API), BigQuery and Pub/Sub (``apache_beam.io``'s guarded
imports) and pymongo (MongoDB IO). They cost every launch and every multi_processing worker's
start, on the critical path of a job's first stage (most of ``refilter``'s cost is such fixed
cost; bench/MEASUREMENTS.md: lean Beam import). Each stays importable afterwards: pyarrow imports
pandas for some conversions, and GCS paths go through Beam's file systems, loaded either way."""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from collections.abc import Iterator

# Each one's import is guarded in Beam (an ImportError means "not installed").
# Beam's GCS filesystem is loaded when a gs:// path is first used (tokenmill/beamfs.py).
GOOGLE = ("apache_beam.io.gcp.bigquery", "apache_beam.io.gcp.gcsfilesystem")
OPTIONAL = ("pandas", "pymongo", *GOOGLE)


# Beam's state sampler (a thread per bundle that samples which step is running, for its msec
# counters) sleeps up to 200 ms between samples, and every bundle ends by joining it: a worker
# idles up to 200 ms (100 on average) at the end of each bundle longer than about a second
# (bench/MEASUREMENTS.md: state sampling). tokenmill reads none of those counters; at 20 ms the
# sampling goes on and the wait is a tenth.
SAMPLING_PERIOD_MS = 20


def shorten_state_sampling() -> None:
    """Every StateSampler made from now on in this process samples every SAMPLING_PERIOD_MS
    (its default period, left alone if Beam's is not the 200 ms this was measured against)."""
    from apache_beam.runners.worker import statesampler

    init = statesampler.StateSampler.__init__
    if init.__defaults__ == (200,) and statesampler.DEFAULT_SAMPLING_PERIOD_MS == 200:
        init.__defaults__ = (SAMPLING_PERIOD_MS,)


@contextlib.contextmanager
def without_optional(names: tuple[str, ...] = OPTIONAL) -> Iterator[None]:
    """Imports meanwhile see the ``names`` modules not loaded yet as not installed."""
    blocked = [m for m in names if m not in sys.modules]
    for m in blocked:
        sys.modules[m] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for m in blocked:
            del sys.modules[m]


def import_lean(name: str) -> types.ModuleType:
    """``importlib.import_module(name)``, with the OPTIONAL modules not loaded yet failing to
    import meanwhile. The allocator settings go first: Beam's import allocates through them."""
    from tokenmill.memory import tame_allocators

    tame_allocators()
    with without_optional():
        module = importlib.import_module(name)
    shorten_state_sampling()
    send_worker_id_on_state_channel()
    cache_graph_introspection()
    servers_on_loopback()
    return module


# The hosts that mean "every interface" in a gRPC address: rewritten to localhost below.
WILDCARD = ("[::]", "0.0.0.0", "", "::", "[::0]", "*")


def servers_on_loopback() -> None:
    """Every gRPC server Beam starts in this process listens on loopback, not on every interface.

    Beam 2.62 binds its runner's control, data, state and logging servers, its worker pools and
    its local job and artifact services to ``[::]:port`` and hands their clients
    ``localhost:port``: the workers it starts run on this machine, yet anyone who reached the
    ports could pose as a worker and receive the job's code and documents, or ask a pool to run
    a worker against a control endpoint of their choosing. A wildcard host becomes ``localhost``
    (IPv4 and IPv6 loopback); an address a caller names (the worker pool's ``--bind``) is kept."""
    try:
        from grpc._server import _Server
    except ImportError:  # a grpc without the class: tests/test_network.py fails on the wildcard
        return
    if getattr(_Server.add_insecure_port, "tokenmill_loopback", False):
        return
    add = _Server.add_insecure_port

    def add_insecure_port(self, address: str) -> int:
        host, _, port = address.rpartition(":")
        return add(self, f"localhost:{port}" if host in WILDCARD else address)

    add_insecure_port.tokenmill_loopback = True
    _Server.add_insecure_port = add_insecure_port


def send_worker_id_on_state_channel() -> None:
    """Each SDK worker's state channel carries its worker id, as its control and data channels do.

    Beam 2.62's ``GrpcStateHandlerFactory`` makes the channel's ``WorkerIdInterceptor()`` without
    the id (it falls back to the WORKER_ID environment variable, unset in a LOOPBACK worker);
    newer Beams pass the harness's id, and Prism 2.65+ refuses a state request without one
    ("worker_id read from context metadata is an empty string", in the first step that reads
    state: Dedup). This is that later fix, for the SDK the project pins; a Beam whose factory takes
    a ``worker_id`` already has it and is left alone."""
    import inspect
    import threading

    from apache_beam.runners.worker import sdk_worker

    base = sdk_worker.GrpcStateHandlerFactory
    harness_init = sdk_worker.SdkHarness.__init__
    if "worker_id" in inspect.signature(base.__init__).parameters or hasattr(harness_init, "tokenmill"):
        return
    interceptor = sdk_worker.WorkerIdInterceptor
    making = threading.Lock()  # one factory at a time names the interceptor's id

    class StateHandlerFactory(base):
        worker_id: str | None = None

        def create_state_handler(self, api_service_descriptor):
            # Beam's own, with sdk_worker's WorkerIdInterceptor giving this factory's id to the
            # one interceptor it makes without an id (the others in sdk_worker pass theirs)
            worker_id = self.worker_id

            class WithId(interceptor):
                def __init__(self, worker_id_: str | None = None) -> None:
                    super().__init__(worker_id_ or worker_id)

            with making:
                sdk_worker.WorkerIdInterceptor = WithId
                try:
                    return super().create_state_handler(api_service_descriptor)
                finally:
                    sdk_worker.WorkerIdInterceptor = interceptor

    def init(harness, *args, **kwargs) -> None:
        harness_init(harness, *args, **kwargs)
        harness._state_handler_factory.__class__ = StateHandlerFactory
        harness._state_handler_factory.worker_id = harness._worker_id

    init.tokenmill = True  # type: ignore[attr-defined]
    sdk_worker.SdkHarness.__init__ = init


def cache_graph_introspection() -> None:
    """Beam works two things out again and again while it builds and translates a graph: a
    DoFn's state and timer specs (``userstate.get_dofn_specs``: the signature of each of the
    DoFn's ~30 methods, up to six times per DoFn) and an options view (``view_as``: a new
    argparse parser over every flag, twice per transform). Both are fixed once made, so each is
    kept for the object it was made for: tokenmill's graph (~180 transforms) is built and
    translated 0.4 s sooner, on the launcher's path to the first bundle (bench/MEASUREMENTS.md:
    graph introspection cached)."""
    import weakref

    from apache_beam.options import pipeline_options
    from apache_beam.transforms import userstate

    if getattr(userstate.get_dofn_specs, "tokenmill", False):
        return
    specs_of = userstate.get_dofn_specs
    specs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_dofn_specs(dofn):
        try:
            return specs[dofn]
        except KeyError:
            found = specs[dofn] = specs_of(dofn)
            return found
        except TypeError:  # a DoFn that cannot be a weak key (unhashable, or slots)
            return specs_of(dofn)

    view_as = pipeline_options.PipelineOptions.view_as
    views: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def cached_view_as(options, cls):
        # A view shares its options' values (their _all_options), so one view per class is the
        # same as a new one each time, unless the flags it was parsed from were replaced.
        try:
            flags, made = views[options]
        except KeyError:
            flags, made = views[options] = (options._flags, {})
        except TypeError:
            return view_as(options, cls)
        if flags is not options._flags:
            flags, made = views[options] = (options._flags, {})
        if cls not in made:
            made[cls] = view_as(options, cls)
        return made[cls]

    get_dofn_specs.tokenmill = True  # type: ignore[attr-defined]
    userstate.get_dofn_specs = get_dofn_specs
    pipeline_options.PipelineOptions.view_as = cached_view_as
