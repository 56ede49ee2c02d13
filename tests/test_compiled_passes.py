"""`pipe.enable_compiled_passes()`: the backbone's passes through torch.compile give eager's codes, keep `exact` exact,
and fall back to eager, saying so once, where the backend cannot compile (issue 39, part 3). Compiling takes tens of
seconds on this CPU: each test compiles once."""

import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from threading import Barrier

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from ssd_pipelines import ExactDecoding, SamplingConfig
from ssd_pipelines.backbones.causal_lm import STATIC_PROMPT_MULTIPLE
from ssd_pipelines.testing import tiny_heads, tiny_pipeline
from ssd_pipelines.testing.exactness import TOY_PROMPT, grid_probabilities, measure, toy_setup

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
    assert pipe.image_backbone.runner.active  # kept on the decoder: every adapter of the pipeline sees it
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no fallback: the compiled passes ran
        compiled = [codes(pipe, *call) for call in calls]
    for call, expected, got in zip(calls, eager, compiled):
        assert torch.equal(got, expected), call
    pipe.disable_compiled_passes()
    assert not pipe.image_backbone.runner.active


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
        later = pipe(["blue"], decoding="exact", output_type="latent")
        again = codes(pipe, "exact", {}, 1.0)
    # each call it serves says so, with the cause, in its warnings and stats
    assert any("this backbone's pass ran eagerly" in w and "this backend compiles nothing" in w for w in later.warnings)
    assert later.stats["eager_calls"] >= later.stats["forward_passes"] - 1 and later.stats["compiled_calls"] == 0
    said = [str(w.message) for w in seen if "could not compile this backbone's pass" in str(w.message)]
    assert len(said) == 1 and "from now on it runs eagerly" in said[0], [str(w.message) for w in seen]
    assert torch.equal(fallen_back, eager) and torch.equal(again, eager)
    assert not pipe.image_backbone.runner.active


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
    assert backbone.runner.active and g.passes, g


def test_static_passes_take_one_graph_a_width_and_give_eager_codes():
    """dynamic=False: every pass over the image attends over all of its slots, so the graphs are one per width (ar's
    1 and 2 with end-of-line, block ssd's blocks, the window), not one per pass. Traced with "aot_eager": the shapes
    and the masks are what is checked here, not inductor's kernels."""
    pipe = tiny_pipeline()
    eager = [codes(pipe, decoding, options, 1.0) for decoding, options in CALLS]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # the graphs counted below are this test's
    pipe.enable_compiled_passes(dynamic=False, backend="aot_eager")
    assert pipe.image_backbone.runner.static
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


def test_static_passes_serve_prompts_of_other_lengths_with_the_same_graphs():
    """The prompts' width sets the shapes of the cache and of every pass's mask: under static passes it is padded to
    a multiple of STATIC_PROMPT_MULTIPLE tokens, so a prompt of another length compiles nothing new (dynamo would
    compile each width anew, and run eagerly from its eighth)."""
    pipe = tiny_pipeline()
    prompts = ["blue", "a red circle", "a red circle left of a blue square"]
    widths = {pipe.image_backbone.encode_prompts([p], guidance=True).input_ids.shape[1] for p in prompts}
    assert len(widths) == len(prompts) and max(widths) <= STATIC_PROMPT_MULTIPLE, widths

    def call(prompt):
        return pipe([prompt], decoding="exact", generator=torch.Generator().manual_seed(3), output_type="latent").codes

    eager = [call(prompt) for prompt in prompts]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    pipe.enable_compiled_passes(dynamic=False, backend="aot_eager")
    assert torch.equal(call(prompts[0]), eager[0])
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for prompt, expected in zip(prompts[1:], eager[1:]):
        assert torch.equal(call(prompt), expected), prompt
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
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


def poison(tensor: torch.Tensor) -> None:
    """Overwrite a tensor as a CUDA graph's next replay overwrites what it returned before."""
    if tensor.dtype == torch.bool:
        tensor.logical_not_()
    elif tensor.is_floating_point():
        tensor.fill_(float("nan"))
    else:
        tensor.fill_(-(2**40))


class CudaGraphRules:
    """What CUDA graphs ask of a graph (mode="reduce-overhead"), checked on the CPU as a backend over aot_eager's
    graphs:
    - `unheld`: per graph, the inputs it writes that are not static. A CUDA graph replays over the addresses it
      recorded, so inductor runs such a graph without one;
    - `addresses`: per graph, the addresses of its static inputs at each run. Where they moved, inductor records
      the graph again;
    - as each replay writes its outputs into the memory of the last, every output of every earlier graph is
      poisoned when a graph runs: a call that keeps one, rather than a copy, goes wrong."""

    def __init__(self):
        self.unheld: list[list[int]] = []
        self.addresses: dict[int, set[tuple[int, ...]]] = {}
        self.backend = aot_autograd(fw_compiler=self.compile_graph, keep_inference_input_mutations=True)

    def compile_graph(self, graph_module, example_inputs):
        meta = torch._guards.TracingContext.get().fw_metadata
        static = list(meta.static_input_indices)
        written = {i for i, info in enumerate(meta.input_info) if info.mutates_data}
        self.unheld.append(sorted(written - set(static)))
        graph = len(self.unheld)
        returned = self.returned = getattr(self, "returned", [])

        def replay(*args):
            self.addresses.setdefault(graph, set()).add(tuple(args[i].data_ptr() for i in static))
            for tensor in returned:
                poison(tensor)
            returned.clear()
            outputs = graph_module(*args)
            inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
            returned.extend(  # a view of an input is the input's memory, not the graph's
                o for o in outputs if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs
            )
            return outputs

        return make_boxed_func(replay)


@pytest.mark.parametrize(
    "options, graphs",
    [
        ({}, False),
        ({"mode": "max-autotune-no-cudagraphs"}, False),
        ({"mode": "reduce-overhead"}, True),
        ({"mode": "max-autotune"}, True),
        ({"options": {"triton.cudagraphs": True}}, True),
    ],
)
def test_cuda_graphs_however_asked_for_take_static_passes_and_held_state(options, graphs):
    """A mode or inductor's own switch: either way CUDA graphs need static shapes and state at fixed addresses."""
    pipe = tiny_pipeline()
    pipe.enable_compiled_passes(**options)
    backbone = pipe.image_backbone
    assert backbone.runner.static == graphs
    first = backbone.runner.full("codes", (2, 3), -1, torch.long, backbone.device)
    second = backbone.runner.full("codes", (2, 3), 0, torch.long, backbone.device)
    assert (first.data_ptr() == second.data_ptr()) == graphs  # held: the next call writes where the last one did
    assert torch.equal(second, torch.zeros(2, 3, dtype=torch.long))
    pipe.disable_compiled_passes()


@pytest.mark.parametrize("options", [{"mode": "reduce-overhead"}, {"options": {"triton.cudagraphs": True}}])
def test_cuda_graphs_with_dynamic_shapes_are_refused(options):
    pipe = tiny_pipeline()
    with pytest.raises(ValueError, match="every pass would record a graph of its own: pass dynamic=False"):
        pipe.enable_compiled_passes(dynamic=True, **options)
    assert not pipe.image_backbone.runner.active  # nothing was half set up


@pytest.mark.parametrize("drafter", ["cell", "recurrent"])
def test_passes_captured_as_cuda_graphs_hold_what_they_write_and_keep_no_output(drafter, monkeypatch):
    """mode="reduce-overhead" on a GPU replays each graph as a CUDA graph. Here torch.compile is given the CPU
    stand-in of those rules (`CudaGraphRules`) in its place: every graph of every decoding writes only held state
    (the KV cache, the codes, the frontier's q, hidden states and counters); eager's codes come out although each
    graph's outputs are overwritten as the next one runs; and a call repeated in a thread finds its state where the
    last one left it, so its graphs replay rather than record again."""
    pipe = tiny_pipeline()
    pipe.heads = tiny_heads(pipe.image_backbone, drafter=drafter)
    calls = [*CALLS, ("ssd", {"vertical_rows": 2})] if drafter == "cell" else CALLS  # a block of two rows
    eager = [codes(pipe, decoding, options, 1.0) for decoding, options in calls]
    rules = CudaGraphRules()
    compile_for_the_cpu = torch.compile

    def compile_as_cuda_graphs(fn, mode=None, **options):
        assert mode == "reduce-overhead"
        return compile_for_the_cpu(fn, backend=rules.backend, **options)

    monkeypatch.setattr(torch, "compile", compile_as_cuda_graphs)
    torch._dynamo.reset()
    pipe.enable_compiled_passes(mode="reduce-overhead")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        captured = [codes(pipe, decoding, options, 1.0) for decoding, options in calls]
        for call, expected, got in zip(calls, eager, captured):
            assert torch.equal(got, expected), call
        assert len(rules.unheld) >= 4 and not any(rules.unheld), rules.unheld  # passes and steps: none loose
        rules.addresses.clear()
        again = [codes(pipe, "exact", {}, 1.0) for _ in range(2)]
    assert torch.equal(again[0], eager[1]) and torch.equal(again[1], eager[1])
    moved = {graph: len(seen) for graph, seen in rules.addresses.items() if len(seen) > 1}
    assert rules.addresses and not moved, moved
    pipe.disable_compiled_passes()


def test_compiled_calls_from_many_threads_run_on_one_owner_and_each_give_their_seeds_codes():
    """Gradio and ComfyUI call one pipeline from worker threads: their compiled calls queue on the model's one owning
    thread (`compiled.PassOwner`), so they replay one set of graphs, while each call's callbacks still run in the
    thread that called, and each call keeps its state (its seed's codes)."""
    pipe = tiny_pipeline()
    seeds = (1, 2, 3, 4)

    def call(seed, **kwargs):
        generator = torch.Generator().manual_seed(seed)
        return pipe(["a red circle"], decoding="exact", generator=generator, output_type="latent", **kwargs)

    eager = [call(seed).codes for seed in seeds]
    torch._dynamo.reset()
    pipe.enable_compiled_passes(dynamic=False, backend="aot_eager")
    assert call(seeds[0]).stats["graphs_compiled"] > 0  # compile once: then every thread's call replays
    callers: dict[int, set[str]] = {}
    started = Barrier(len(seeds), timeout=60)

    def in_a_thread(seed):
        started.wait()  # all at once

        def on_row(_pipe, _row, _timestep, _tensors):
            callers.setdefault(seed, set()).add(threading.current_thread().name)
            return {}

        return threading.current_thread().name, call(seed, callback_on_step_end=on_row)

    with ThreadPoolExecutor(len(seeds)) as pool:
        together = [f.result() for f in [pool.submit(in_a_thread, seed) for seed in seeds]]
    owner = pipe.image_backbone.runner.owner.thread.name
    for seed, alone, (thread, out) in zip(seeds, eager, together):
        assert torch.equal(out.codes, alone), seed
        assert out.stats["graphs_compiled"] == 0 and out.stats["compiled_calls"] > 0, seed
        assert callers[seed] == {thread} and thread != owner, (callers, owner)
    pipe.disable_compiled_passes()


def test_a_callback_that_raises_on_a_compiled_call_stops_it_and_raises_in_the_caller():
    pipe = tiny_pipeline()
    pipe.enable_compiled_passes(dynamic=False, backend="aot_eager")
    rows = []

    def fail_at_row_two(_pipe, row, _timestep, _tensors):
        rows.append(row)
        if row == 2:
            raise KeyboardInterrupt("stopped by the user")  # ComfyUI's interrupt raises from the callback
        return {}

    with pytest.raises(KeyboardInterrupt, match="stopped by the user"):
        pipe(["blue"], decoding="exact", output_type="latent", callback_on_step_end=fail_at_row_two)
    assert rows == [0, 1, 2]  # no row after the one that raised
    out = pipe(["blue"], decoding="exact", output_type="latent")  # the owner serves the next call
    assert out.rows_completed == pipe.image_backbone.grid.rows
    pipe.disable_compiled_passes()


def test_an_interrupted_compiled_call_stops_after_the_row_it_is_in():
    pipe = tiny_pipeline()
    rows = 3

    def first_rows(decoding, **options):
        def stop(p, row, _timestep, _tensors):
            p._interrupt = row == rows - 1
            return {}

        out = pipe(
            ["blue"],
            decoding=decoding,
            generator=torch.Generator().manual_seed(5),
            output_type="latent",
            callback_on_step_end=stop,
            **options,
        )
        return out.rows_completed, out.stats["forward_passes"], out.codes[:, :rows]

    calls = [("ar", {}), ("exact", {}), ("ssd", {"verify_rounds": 2})]
    eager = [first_rows(decoding, **options) for decoding, options in calls]
    full = pipe(["blue"], decoding="ar", output_type="latent").stats["forward_passes"]
    torch._dynamo.reset()
    pipe.enable_compiled_passes(dynamic=False, backend="aot_eager")
    for call, (rows_done, passes, first) in zip(calls, eager):
        got_rows, got_passes, got_first = first_rows(call[0], **call[1])
        assert got_rows == rows_done == rows and got_passes == passes, call
        assert torch.equal(got_first, first), call
    assert eager[0][1] < full
    pipe.disable_compiled_passes()


def test_a_pipeline_moved_to_another_dtype_compiles_again_and_gives_eager_codes():
    pipe = tiny_pipeline()
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    pipe.enable_compiled_passes(dynamic=False, backend="aot_eager")
    assert torch.equal(codes(pipe, "exact", {}, 1.0), codes_eagerly(pipe))
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    pipe.to(torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        moved = codes(pipe, "exact", {}, 1.0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs  # the float32 graphs fail their guards
    assert pipe.image_backbone.runner.active and pipe.image_backbone.dtype == torch.float64
    assert torch.equal(moved, codes_eagerly(pipe))
    pipe.disable_compiled_passes()


def codes_eagerly(pipe):
    """`exact`'s codes with the compiled passes set aside for the call."""
    backbone = pipe.image_backbone
    options = backbone.runner.options
    pipe.disable_compiled_passes()
    try:
        return codes(pipe, "exact", {}, 1.0)
    finally:
        backbone.compile_passes(options)


def test_compiling_with_inductor_on_a_cpu_says_it_does_not_pay():
    """Issue 56, case 17: enable_compiled_passes() spent 150 s compiling on a CPU for no gain, and said nothing."""
    from ssd_pipelines.pipeline_ssd import COMPILING_ON_A_CPU

    pipe = tiny_pipeline()
    for options in ({}, {"backend": "inductor", "mode": "max-autotune-no-cudagraphs"}):
        with pytest.warns(UserWarning) as caught:
            pipe.enable_compiled_passes(**options)
        assert [str(w.message) for w in caught] == [COMPILING_ON_A_CPU]
    assert "149 s, then 1.46 s a call against eager's 1.32 s" in COMPILING_ON_A_CPU
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe.enable_compiled_passes(backend="aot_eager")  # a backend chosen to trace, not to be fast
    pipe.disable_compiled_passes()
