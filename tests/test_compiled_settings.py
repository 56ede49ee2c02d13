"""Compiled passes that hold (issue 51): calls that vary their sampling settings, batch and decoding replay graphs of a
bounded number, every pass and step compiled, and say in their warnings and stats whatever ran otherwise. Run with
`fail_on_recompile_limit_hit`, so that dynamo's giving up on a function would raise rather than run it eagerly."""

import random

import pytest
import torch

from ssd_pipelines.decoding.batch_buckets import bucket
from ssd_pipelines.testing import tiny_heads, tiny_pipeline


@pytest.fixture
def recompile_limit_raises():
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


def varied_calls(count: int, seed: int = 0) -> list[dict]:
    """`count` calls as users of a server send them: guidance 1 to 12, temperature 0 to 1.3, top-k and top-p on or
    off, 1 to 6 images, `ar`, `exact` and `ssd`, with in-row and recurrent heads."""
    pick = random.Random(seed)
    calls = []
    for i in range(count):
        calls.append(
            {
                "decoding": ("ar", "exact", "ssd")[i % 3],
                "drafter": ("inrow", "recurrent")[i // 3 % 2],
                "images": 1 + i % 6,
                "guidance_scale": pick.choice([1.0, 1.0 + 11 * pick.random()]),
                "temperature": pick.choice([0.0, round(1.3 * pick.random(), 3)]),
                "top_k": pick.choice([None, pick.randint(1, 40)]),
                "top_p": pick.choice([None, round(pick.uniform(0.5, 1.0), 3)]),
                "seed": i,
            }
        )
    return calls


def call(pipe, heads: dict, options: dict):
    options = dict(options)
    pipe.heads = heads[options.pop("drafter")]
    images, seed = options.pop("images"), options.pop("seed")
    return pipe(
        ["a red circle"] * images,
        generator=[torch.Generator().manual_seed(seed + 100 * b) for b in range(images)],
        output_type="latent",
        **options,
    )


def test_thirty_calls_of_varied_settings_run_compiled_on_bounded_graphs_and_give_eager_codes(recompile_limit_raises):
    pipe = tiny_pipeline()
    heads = {kind: tiny_heads(pipe.image_backbone, drafter=kind, seed=3) for kind in ("inrow", "recurrent")}
    calls = varied_calls(30)
    eager_outs = [call(pipe, heads, options) for options in calls]
    eager = [out.codes for out in eager_outs]
    torch._dynamo.reset()
    pipe.enable_compiled_passes(dynamic=False, backend="eager")
    compiled = [call(pipe, heads, options) for options in calls]
    for options, expected, out in zip(calls, eager_outs, compiled):
        assert torch.equal(out.codes, expected.codes), options
        for stat in ("images", "forward_passes", "drafted_per_round", "accepted_per_round"):  # batches padded alike
            assert out.stats[stat] == expected.stats[stat], (options, stat)
        assert out.warnings == [] and out.stats["eager_calls"] == 0, (options, out.warnings)
        assert out.stats["compiled_calls"] >= out.stats["forward_passes"] - 1, options  # all but the eager prefill
    runner = pipe.image_backbone.runner
    functions = [runner.forward, *runner.steps.values()]
    specializations = sum(len(f.specializations) for f in functions)
    graphs = sum(f.graphs() for f in functions)
    assert graphs == specializations  # one graph a specialization: nothing compiled twice
    # what a specialization is made of: batch bucket (1, 2, 4, 8) x guided or not x greedy or not x top-k x top-p,
    # per width and
    # decoding; the 30 calls meet fewer of them than they would with a graph a guidance scale or temperature
    structures = {
        (bucket(o["images"]), o["guidance_scale"] > 1, o["temperature"] == 0, o["top_k"] is None, o["top_p"] is None)
        for o in calls
    }
    assert graphs <= 6 * len(structures) < sum(out.stats["compiled_calls"] for out in compiled), (graphs, structures)
    assert sum(out.stats["graphs_compiled"] for out in compiled) == graphs
    again = call(pipe, heads, calls[4])  # warm: nothing compiles
    assert again.stats["graphs_compiled"] == 0 and torch.equal(again.codes, eager[4])
    pipe.disable_compiled_passes()


def test_the_ninth_guidance_scale_still_runs_compiled(recompile_limit_raises):
    """The reproduction of issue 51: dynamo guarded on the guidance scale, gave up on the verification at the ninth
    value and ran it eagerly from then on, with nothing in `warnings`."""
    pipe = tiny_pipeline()
    scales = range(2, 13)

    def exact(pipe, g):
        return pipe(
            "a red circle",
            decoding="exact",
            guidance_scale=g,
            generator=torch.Generator().manual_seed(1),
            output_type="latent",
        )

    eager = [exact(pipe, g).codes for g in scales]
    torch._dynamo.reset()
    pipe.enable_compiled_passes(backend="eager", dynamic=False)
    outs = [exact(pipe, g) for g in scales]
    for expected, out in zip(eager, outs):
        assert torch.equal(out.codes, expected) and out.warnings == [] and out.stats["eager_calls"] == 0
    assert all(out.stats["graphs_compiled"] == 0 for out in outs[1:])  # the first call's graphs serve every scale
    pipe.disable_compiled_passes()


def test_batches_of_a_bucket_share_its_graphs_and_give_their_unpadded_codes(recompile_limit_raises):
    """3 and 4 images run as 4, 5 and 8 as 8: the second call of a bucket compiles nothing, and each call's codes,
    passes and acceptance counts are those of its batch decoded eagerly, unpadded (the padding clones its last
    image: prompt and noise)."""
    pipe = tiny_pipeline()
    sizes = (3, 4, 8, 5)
    options = [{"decoding": "exact", "drafter": "recurrent", "images": n, "seed": n} for n in sizes]
    heads = {"recurrent": tiny_heads(pipe.image_backbone, drafter="recurrent", seed=3)}
    eager = [call(pipe, heads, o) for o in options]
    torch._dynamo.reset()
    pipe.enable_compiled_passes(dynamic=False, backend="eager")
    compiled = [call(pipe, heads, o) for o in options]
    for n, expected, out in zip(sizes, eager, compiled):
        assert out.codes.shape[0] == out.stats["images"] == n
        assert torch.equal(out.codes, expected.codes), n
        for stat in ("forward_passes", "drafted_per_round", "accepted_per_round"):
            assert out.stats[stat] == expected.stats[stat], (n, stat)
    assert [out.stats["graphs_compiled"] > 0 for out in compiled] == [True, False, True, False]
    pipe.disable_compiled_passes()
    assert [bucket(n) for n in (1, 2, 3, 5, 9, 33, 64, 65, 130)] == [1, 2, 4, 8, 16, 64, 64, 128, 192]
