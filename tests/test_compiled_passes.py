"""`pipe.enable_compiled_passes()`: the backbone's passes through torch.compile give eager's codes, keep `exact` exact,
and fall back to eager, saying so once, where the backend cannot compile (issue 39, part 3). Compiling takes tens of
seconds on this CPU: each test compiles once."""

import warnings

import pytest
import torch

from ssd_pipelines import ExactDecoding, SamplingConfig
from ssd_pipelines.benchmarks.exactness import TOY_PROMPT, grid_probabilities, measure, toy_setup
from ssd_pipelines.testing import tiny_heads, tiny_pipeline

CALLS = [("ar", {}), ("exact", {}), ("ssd", {"verify_rounds": 2}), ("ssd", {"verify_rounds": 2, "window": 5})]


def codes(pipe, decoding, options, temperature):
    out = pipe(
        ["a red circle", "blue"],
        num_images_per_prompt=2,
        decoding=decoding,
        temperature=temperature,
        generator=[torch.Generator().manual_seed(seed) for seed in range(4)],
        output_type="latent",
        **options,
    )
    return out.codes


def test_compiled_passes_give_the_codes_of_eager_ones():
    pipe = tiny_pipeline()
    calls = [(decoding, options, temperature) for decoding, options in CALLS for temperature in (1.0, 0.0)]
    eager = [codes(pipe, *call) for call in calls]
    pipe.enable_compiled_passes()
    assert pipe.image_backbone.passes_compiled  # kept on the decoder: every adapter of the pipeline sees it
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback: the compiled passes ran
        compiled = [codes(pipe, *call) for call in calls]
    for call, expected, got in zip(calls, eager, compiled):
        assert torch.equal(got, expected), call
    pipe.disable_compiled_passes()
    assert not pipe.image_backbone.passes_compiled


def test_a_pass_the_backend_cannot_compile_runs_eagerly_and_says_so_once():
    pipe = tiny_pipeline()
    eager = codes(pipe, "exact", {}, 1.0)

    def failing_backend(graph, example_inputs):
        raise RuntimeError("this backend compiles nothing")

    torch._dynamo.reset()  # what an earlier test compiled for this model class would pass the guards: no backend call
    pipe.enable_compiled_passes(backend=failing_backend)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fallen_back = codes(pipe, "exact", {}, 1.0)
        again = codes(pipe, "exact", {}, 1.0)
    said = [str(w.message) for w in seen if "could not compile this backbone's pass" in str(w.message)]
    assert len(said) == 1 and "from now on it runs eagerly" in said[0], [str(w.message) for w in seen]
    assert torch.equal(fallen_back, eager) and torch.equal(again, eager)
    assert not pipe.image_backbone.passes_compiled


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_exact_on_compiled_passes_samples_the_ar_distribution(one_thread):
    """The G test of the enumerable grid (tests/test_decoding_distribution.py), the probabilities computed eagerly,
    the 30,000 images drawn on compiled passes."""
    backbone, heads = toy_setup()
    sampling = SamplingConfig(temperature=1.0, guidance_scale=2.0)
    probs = grid_probabilities(backbone, TOY_PROMPT, sampling)
    backbone.compile_passes({"dynamic": True})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        g = measure(ExactDecoding(heads, window=4), backbone, sampling, 30_000, 7, probs).g
    assert backbone.passes_compiled and g.passes, g


def test_static_passes_take_one_graph_a_width_and_give_eager_codes():
    """dynamic=False: every pass over the image attends over all of its slots, so the graphs are one per width (ar's
    1 and 2 with end-of-line, block ssd's blocks, the window), not one per pass. Traced with "aot_eager": the shapes
    and the masks are what is checked here, not inductor's kernels."""
    pipe = tiny_pipeline()
    eager = [codes(pipe, decoding, options, 1.0) for decoding, options in CALLS]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # the graphs counted below are this test's
    pipe.enable_compiled_passes(dynamic=False, backend="aot_eager")
    assert pipe.image_backbone.static_passes
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        static = [codes(pipe, decoding, options, 1.0) for decoding, options in CALLS]
    for call, expected, got in zip(CALLS, eager, static):
        assert torch.equal(got, expected), call
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    passes = sum(pipe(["a"], decoding=d, output_type="latent", **o).stats["forward_passes"] for d, o in CALLS)
    assert graphs <= 10 < passes, (graphs, passes)
    # one graph a pass: the hidden states the heads read reach the call inside it (a context variable broke it)
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    pipe.disable_compiled_passes()


def tracing_backend(traces: list[str]):
    """aot_eager, recording the source lines each graph was traced from (their functions' names included)."""

    def backend(graph_module, example_inputs):
        traces.append("\n".join(node.meta.get("stack_trace") or "" for node in graph_module.graph.nodes))
        return torch._dynamo.lookup_backend("aot_eager")(graph_module, example_inputs)

    return backend


@pytest.mark.parametrize("drafter", ["cell", "inrow", "recurrent"])
def test_drafting_and_verification_steps_compile_with_the_passes_and_give_eager_codes(drafter):
    """The engines' steps between passes are graphs of their own, traced whole, and eager's codes come out: the
    frontier's drafting step (its window's width under static passes) and its verification, and block ssd's row,
    which an in-row drafter steps through cell by cell (one graph for the whole row, its uniforms drawn before)."""
    pipe = tiny_pipeline()
    pipe.heads = tiny_heads(pipe.image_backbone, drafter=drafter)
    calls = [("exact", {}), ("ssd", {"verify_rounds": 2}), ("ssd", {"verify_rounds": 2, "window": 5})]
    eager = [codes(pipe, decoding, options, 1.0) for decoding, options in calls]
    traces: list[str] = []
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    pipe.enable_compiled_passes(dynamic=False, backend=tracing_backend(traces))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        compiled = [codes(pipe, decoding, options, 1.0) for decoding, options in calls]
    for call, expected, got in zip(calls, eager, compiled):
        assert torch.equal(got, expected), call
    assert not torch._dynamo.utils.counters["graph_break"], dict(torch._dynamo.utils.counters["graph_break"])
    for step in ("in _draft_step", "in _verify", "in _draft_row"):
        assert any(step in trace for trace in traces), step
    if drafter != "cell":  # a whole row of sequential cells in one graph: each cell's draft is traced in it
        row = next(trace for trace in traces if "in _draft_row" in trace)
        assert row.count("drafter.step(") >= pipe.image_backbone.grid.cols - 1
    pipe.disable_compiled_passes()
