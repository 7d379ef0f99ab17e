"""CombineOnce: CombineGlobally's one output, also for an empty input, without the side input
CombineGlobally's own default reads its output through (which kept the tokenizer sample decoded
in a worker and encoded in the runner for the rest of a job). Real Beam pipelines."""

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from tokenmill.transforms.stage_base import CombineOnce
from tokenmill.transforms.tokenization import SampleFn


def _run(values, fn):
    with beam.Pipeline(FnApiRunner()) as p:
        got = p | beam.Create(values, reshuffle=False) | CombineOnce(fn)
        assert_that(got, equal_to([fn.apply(values)]))  # exactly one element, fn's own output


def test_one_output_for_some_inputs_and_for_none():
    for values in ([3, 4, 5], []):
        _run(values, beam.combiners.CountCombineFn())
    items = [((bytes([i]), f"d{i}"), 10, ("f", i, 1)) for i in range(50)]
    _run(items, SampleFn(20, 10_000))
    _run([], SampleFn(20, 10_000))


def test_no_side_input_in_the_graph():
    p = beam.Pipeline(FnApiRunner())
    _ = p | beam.Create([1, 2]) | CombineOnce(beam.combiners.CountCombineFn())
    proto = p.to_runner_api()
    side = [t.unique_name for t in proto.components.transforms.values()
            if t.spec.urn == "beam:transform:pardo:v1" and _side_inputs(t)]
    assert side == []
    # CombineGlobally with its default has one: what CombineOnce replaces.
    q = beam.Pipeline(FnApiRunner())
    _ = q | beam.Create([1, 2]) | beam.CombineGlobally(beam.combiners.CountCombineFn())
    assert any(_side_inputs(t) for t in q.to_runner_api().components.transforms.values()
               if t.spec.urn == "beam:transform:pardo:v1")


def _side_inputs(transform) -> bool:
    from apache_beam.portability.api import beam_runner_api_pb2

    payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
    return bool(payload.side_inputs)


def test_the_combined_value_survives_any_merge_of_seeds():
    from tokenmill.transforms.stage_base import _OrEmpty

    fn = _OrEmpty(beam.combiners.CountCombineFn())
    seeded = fn.add_input(fn.create_accumulator(), None)
    valued = fn.add_input(fn.create_accumulator(), 7)
    assert fn.extract_output(fn.merge_accumulators([seeded, valued, seeded])) == 7
    assert fn.extract_output(fn.merge_accumulators([seeded, seeded])) == 0  # CountCombineFn's own empty output


def test_the_inputs_reach_the_first_combine_unflattened():
    """Flattened with the seed before combining, the inputs (the report's documents) would wait
    in the runner's Flatten buffer instead of being combined where they are made."""
    p = beam.Pipeline(FnApiRunner())
    docs = p | "Docs" >> beam.Create([1, 2])
    _ = docs | "Once" >> CombineOnce(beam.combiners.CountCombineFn())
    transforms = p.to_runner_api().components.transforms.values()
    combine = next(t for t in transforms if t.unique_name == "Once/Combine")
    docs_pcoll = next(iter(next(t for t in transforms if t.unique_name == "Docs").outputs.values()))
    assert list(combine.inputs.values()) == [docs_pcoll]
