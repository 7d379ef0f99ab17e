"""The local mode a job gets with no runner flags (pipelines/local_mode.py): every core for an
input past MIN_BYTES, in-process below it or on one core, and the user's own flags as given."""

import pytest

from tokenmill.pipelines import local_mode
from tokenmill.pipelines.local_mode import MIN_BYTES, default_flags


@pytest.fixture
def big(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    with open(d / "a.jsonl", "wb") as fh:  # sparse: MIN_BYTES of size, no disk
        fh.truncate(MIN_BYTES + 1)
    return d


@pytest.fixture
def cores(monkeypatch):
    def set_cores(n, gib=64):
        monkeypatch.setattr(local_mode, "usable_cores", lambda: n)
        monkeypatch.setattr(local_mode, "available_memory", lambda: gib * local_mode.GIB)
    return set_cores


def test_every_core_for_a_big_input(big, cores):
    cores(4)
    assert default_flags([], [str(big)]) == ["--direct_running_mode=multi_processing", "--direct_num_workers=4"]
    assert default_flags([], [str(big / "*.jsonl")]) != []  # a glob
    assert default_flags([], ["gs://bucket/crawl/"]) != []  # remote: not measured, taken as big


def test_in_process_for_a_small_input_or_one_core(tmp_path, big, cores):
    (tmp_path / "small.jsonl").write_text('{"text": "hi"}\n')
    cores(4)
    assert default_flags([], [str(tmp_path / "small.jsonl")]) == []
    cores(1)
    assert default_flags([], [str(big)]) == []


def test_workers_are_held_to_one_per_gib_of_available_memory(big, cores):
    cores(16, gib=3)
    assert default_flags([], [str(big)])[-1] == "--direct_num_workers=3"


@pytest.mark.parametrize("flag", ["--runner=FnApiRunner", "--direct_running_mode=in_memory", "--direct_num_workers=1",
                                  "--runner=FlinkRunner"])
def test_the_users_flags_are_taken_as_given(big, cores, flag):
    cores(4)
    assert default_flags([flag], [str(big)]) == []


def test_beams_state_sampler_waits_a_tenth_at_a_bundles_end():
    """Every bundle ends by joining Beam's state-sampler thread, which sleeps up to its period:
    Beam loaded by tokenmill (launcher and workers) samples every 20 ms, not 200."""
    import subprocess
    import sys

    code = ("from tokenmill.pipelines.beamload import import_lean, SAMPLING_PERIOD_MS; "
            "import_lean('apache_beam.runners.worker.sdk_worker_main'); "
            "from apache_beam.runners.worker import statesampler; "
            "print(SAMPLING_PERIOD_MS, statesampler.StateSampler('s', None).sampling_period_ms)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[-2:] == ["20", "20"]


def test_an_sdk_workers_state_channel_carries_its_worker_id():
    """Beam 2.62 opens a worker's state channel without the worker's id; Prism 2.65+ refuses every
    state request then. Beam loaded by tokenmill sends it, as its control and data channels do."""
    import queue
    from concurrent import futures

    import grpc

    from tokenmill.pipelines.beamload import import_lean

    sdk_worker = import_lean("apache_beam.runners.worker.sdk_worker")
    from apache_beam.portability.api import beam_fn_api_pb2_grpc, endpoints_pb2

    seen = queue.Queue()

    class State(beam_fn_api_pb2_grpc.BeamFnStateServicer):
        def State(self, requests, context):
            seen.put(dict(context.invocation_metadata()).get("worker_id"))
            return iter(())

    server = grpc.server(futures.ThreadPoolExecutor(4))
    beam_fn_api_pb2_grpc.add_BeamFnStateServicer_to_server(State(), server)
    url = f"localhost:{server.add_insecure_port('localhost:0')}"
    server.start()
    try:
        for worker_id in ("worker_7", "worker_8"):
            harness = sdk_worker.SdkHarness(url, worker_id=worker_id)  # connects only
            handler = harness._state_handler_factory.create_state_handler(
                endpoints_pb2.ApiServiceDescriptor(url=url))
            assert seen.get(timeout=30) == worker_id
            harness._state_handler_factory.close()
            handler.done()
    finally:
        server.stop(None)


def test_beams_graph_introspection_is_kept_and_still_right():
    """A DoFn's state and timer specs and an options view are made once per object (Beam makes
    them again for every use), and they say what Beam's own would."""
    from tokenmill.pipelines.beamload import import_lean

    beam = import_lean("apache_beam")
    from apache_beam.coders import VarIntCoder
    from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions
    from apache_beam.transforms import userstate

    class Plain(beam.DoFn):
        def process(self, x):
            yield x

    class Stateful(beam.DoFn):
        seen = userstate.BagStateSpec("seen", VarIntCoder())

        def process(self, kv, seen=beam.DoFn.StateParam(seen)):
            yield kv

    plain, stateful = Plain(), Stateful()
    assert userstate.get_dofn_specs(plain) is userstate.get_dofn_specs(plain) == (set(), set())
    assert not userstate.is_stateful_dofn(plain) and userstate.is_stateful_dofn(stateful)
    assert [s.name for s in userstate.get_dofn_specs(stateful)[0]] == ["seen"]

    opts = PipelineOptions(["--direct_num_workers=3"])
    view = opts.view_as(DirectOptions)
    assert opts.view_as(DirectOptions) is view and view.direct_num_workers == 3
    view.direct_num_workers = 5  # a view's values are its options' values
    assert opts.get_all_options()["direct_num_workers"] == 5
    assert PipelineOptions(["--direct_num_workers=4"]).view_as(DirectOptions).direct_num_workers == 4
