"""One generator per image: an image's codes depend on its own prompt, seed and options, not on its batch.

`pipe(..., generator=[g0, g1, ...])` gives each image its own torch.Generator
(`sampling.ImageGenerators`), as diffusers does. The checks: image i of a batch
of different prompts equals that prompt decoded alone with a generator seeded
the same, for every decoding (on the tiny backbone and on the bundled reference
model); one generator still gives the codes it gave before; a list of the wrong
length says what to pass.
"""

import pytest
import torch

import ssd_pipelines.decoding.run as run_module
from ssd_pipelines import ImageGenerators, SSDAutoregressivePipeline
from ssd_pipelines.decoding.frontier import FrontierRun
from ssd_pipelines.hub import BUNDLED_MODEL
from ssd_pipelines.sampling import sample, uniform, verify_round
from ssd_pipelines.testing import tiny_backbone, tiny_heads, tiny_pipeline, tiny_vqvae

PROMPTS = ["a red circle", "blue", "the green square left of a circle", "red red"]  # 3, 1, 7 and 2 words: padded


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline()


def seeded(*seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def codes(pipe, prompts, generator, **options):
    return pipe(prompts, generator=generator, output_type="latent", **options).codes


DECODINGS = [
    ("ar", {}),
    ("exact", {}),
    ("exact", {"window": 3}),
    ("ssd", {}),
    ("ssd", {"verify_rounds": 6}),  # images converge in different rounds, so rounds stop early in some
    ("ssd", {"verify_rounds": 3, "vertical_rows": 2}),
    ("ssd", {"window": 5}),
    ("auto", {"exact_max_batch": 4}),  # exact for the batch of 4 and for each image alone
    ("sjd", {}),
    ("sjd-pac", {}),
    ("gsd", {}),
    ("zipar", {}),
    ("mtp1d", {}),
]


@pytest.mark.parametrize("guidance", [1.0, 3.0], ids=["no-cfg", "cfg"])
@pytest.mark.parametrize("decoding, options", DECODINGS, ids=[f"{d}-{o}" for d, o in DECODINGS])
def test_an_image_in_a_batch_equals_it_alone(pipe, decoding, options, guidance):
    options = {"decoding": decoding, "guidance_scale": guidance, **options}
    for trial in range(2):
        seeds = [10 * trial + i for i in range(len(PROMPTS))]
        batch = codes(pipe, PROMPTS, seeded(*seeds), **options)
        for i, (prompt, seed) in enumerate(zip(PROMPTS, seeds)):
            alone = codes(pipe, prompt, seeded(seed), **options)
            assert torch.equal(batch[i], alone[0]), (i, trial)
            # alone, a list of one generator and that generator itself draw the same
            assert torch.equal(alone, codes(pipe, prompt, torch.Generator().manual_seed(seed), **options))


def test_auto_chooses_by_the_batch_so_an_image_matches_what_its_batch_chose(pipe):
    """`auto` decodes a batch past its crossover with ar and a lone image with exact: two samplers of one
    distribution, so an image then matches its prompt decoded alone with ar, not with auto."""
    seeds = [3, 4, 5, 6]
    out = pipe(PROMPTS, generator=seeded(*seeds), decoding="auto", exact_max_batch=3, output_type="latent")
    assert out.stats["strategy"] == "auto" and out.stats["chosen_decoding"] == "ar"
    for i, (prompt, seed) in enumerate(zip(PROMPTS, seeds)):
        assert torch.equal(out.codes[i], codes(pipe, prompt, seeded(seed), decoding="ar")[0])
    alone = pipe(PROMPTS[0], generator=seeded(3), decoding="auto", exact_max_batch=3, output_type="latent")
    assert alone.stats["chosen_decoding"] == "exact"
    assert torch.equal(alone.codes, codes(pipe, PROMPTS[0], seeded(3), decoding="exact"))


def test_images_come_out_prompt_by_prompt(pipe):
    """Generator i drives image i, and image i is prompt i // num_images_per_prompt."""
    batch = codes(pipe, PROMPTS[:2], seeded(5, 6, 7, 8), num_images_per_prompt=2, decoding="exact")
    for i, seed in enumerate((5, 6, 7, 8)):
        assert torch.equal(batch[i], codes(pipe, PROMPTS[i // 2], seeded(seed), decoding="exact")[0])
    assert not torch.equal(batch[0], batch[1])  # two images of one prompt, two seeds


def test_block_ssd_noise_that_follows_the_batch_is_caught(pipe, monkeypatch):
    """The test above sees the rule: a block draws the same noise per image whatever its batch. If what it drew
    followed the batch (here a round more per image in it), an image's codes would follow the batch too."""
    right = run_module.uniform

    def by_batch(shape, generator, device):
        images, rounds, cells = shape
        return right((images, rounds + images, cells), generator, device)[:, :rounds]

    monkeypatch.setattr(run_module, "uniform", by_batch)  # DecodeRun.uniform draws a block's noise
    seeds = list(range(len(PROMPTS)))
    batch = codes(pipe, PROMPTS, seeded(*seeds), decoding="ssd", verify_rounds=6)
    alone = [
        codes(pipe, prompt, seeded(seed), decoding="ssd", verify_rounds=6)[0] for prompt, seed in zip(PROMPTS, seeds)
    ]
    assert any(not torch.equal(batch[i], alone[i]) for i in range(len(PROMPTS)))


# What one torch.Generator(manual_seed(7)) gives for ["a red circle", "blue"] x 2 images (the batch draws from it in
# order): these must not change. `ar` and `sjd-pac` are as recorded before generators could be per image; `exact` and
# `ssd` were recorded again when their engines came to draw a pass's (a block's) noise in one piece (NoiseTape).
BEFORE = {
    "ar": [
        [0, 6, 7, 4, 4, 5, 4, 0, 6, 2, 4, 5, 7, 4, 0, 2],
        [0, 6, 7, 4, 4, 4, 4, 0, 6, 2, 4, 4, 1, 0, 4, 4],
        [2, 0, 3, 3, 5, 5, 3, 0, 5, 3, 0, 4, 0, 1, 4, 6],
        [2, 0, 3, 3, 5, 5, 3, 0, 5, 3, 6, 3, 7, 3, 5, 3],
    ],
    "exact": [
        [0, 6, 4, 4, 7, 5, 4, 4, 6, 2, 4, 0, 6, 2, 4, 4],
        [6, 7, 7, 7, 2, 4, 0, 6, 2, 4, 0, 1, 3, 5, 3, 6],
        [2, 0, 3, 3, 5, 5, 2, 5, 4, 4, 6, 3, 7, 6, 4, 0],
        [2, 0, 3, 3, 5, 3, 4, 0, 3, 6, 3, 0, 4, 7, 0, 4],
    ],
    "ssd-r6": [
        [0, 6, 7, 4, 4, 4, 4, 4, 2, 4, 5, 4, 7, 4, 4, 4],
        [6, 7, 7, 7, 7, 2, 4, 0, 2, 4, 0, 5, 3, 5, 6, 4],
        [2, 1, 0, 0, 6, 3, 0, 3, 5, 2, 0, 4, 4, 4, 5, 5],
        [0, 7, 4, 5, 3, 7, 5, 2, 4, 3, 3, 6, 5, 0, 4, 4],
    ],
    "ssd-window": [
        [0, 6, 4, 4, 5, 7, 2, 4, 2, 2, 4, 0, 5, 5, 7, 5],
        [6, 7, 7, 2, 3, 5, 4, 4, 4, 4, 4, 0, 2, 0, 6, 2],
        [2, 0, 3, 0, 4, 5, 3, 6, 5, 5, 3, 6, 7, 3, 5, 3],
        [2, 0, 3, 1, 6, 3, 4, 1, 5, 5, 4, 4, 4, 0, 4, 6],
    ],
    "sjd-pac": [
        [0, 6, 7, 4, 4, 5, 4, 0, 6, 2, 4, 0, 6, 2, 4, 4],
        [0, 6, 7, 4, 4, 5, 4, 0, 6, 2, 4, 0, 7, 4, 4, 3],
        [2, 0, 3, 3, 5, 3, 0, 4, 3, 5, 6, 6, 7, 6, 5, 6],
        [2, 0, 3, 3, 4, 7, 7, 5, 5, 3, 6, 0, 3, 5, 4, 6],
    ],
}
BEFORE_OPTIONS = {
    "ar": {"decoding": "ar"},
    "exact": {"decoding": "exact"},
    "ssd-r6": {"decoding": "ssd", "verify_rounds": 6},
    "ssd-window": {"decoding": "ssd", "window": 5},
    "sjd-pac": {"decoding": "sjd-pac"},
}


@pytest.mark.parametrize("case", list(BEFORE))
def test_one_generator_gives_the_codes_it_gave_before(pipe, case):
    out = codes(
        pipe,
        ["a red circle", "blue"],
        torch.Generator().manual_seed(7),
        num_images_per_prompt=2,
        **BEFORE_OPTIONS[case],
    )
    assert out.flatten(1).tolist() == BEFORE[case]


@pytest.mark.parametrize(
    "generator, message",
    [
        (
            seeded(1, 2, 3),
            r"or a list of 4 \(len\(prompt\) \* num_images_per_prompt = 2 \* 2\), one per image; got a list of 3",
        ),
        ([], "or a list of 4 .*got a list of 0"),
        ([torch.Generator(), 5, torch.Generator(), torch.Generator()], "item 1 is a int: pass torch.Generator"),
        (7, "`generator` must be one torch.Generator for the whole batch, or a list of 4 .*; got a int"),
    ],
)
def test_a_wrong_list_of_generators_says_what_to_pass(pipe, generator, message):
    with pytest.raises(ValueError, match=message):
        pipe(["a red circle", "blue"], num_images_per_prompt=2, generator=generator, output_type="latent")


def test_strategies_take_a_list_and_check_its_length(pipe):
    backbone = pipe.image_backbone
    from ssd_pipelines import ARDecoding, SamplingConfig

    prompts = backbone.encode_prompts(PROMPTS[:2])
    with pytest.raises(ValueError, match="or a list of 2, one per image; got a list of 3"):
        ARDecoding().decode(backbone, prompts, SamplingConfig(), generator=seeded(1, 2, 3))
    with pytest.raises(ValueError, match="item 0 is a str: pass torch.Generator"):
        ARDecoding().decode(backbone, prompts, SamplingConfig(), generator=["seed", torch.Generator()])


def test_per_image_draws_follow_each_images_own_stream():
    """Row b from generator b; flattened rows by the image each belongs to, in order; a negative image draws
    nothing; a single generator ignores `images` and draws as before."""
    source = ImageGenerators(seeded(1, 2))
    u = uniform((2, 3), source, torch.device("cpu"))
    assert torch.equal(u[0], torch.rand(3, generator=torch.Generator().manual_seed(1)))
    assert torch.equal(u[1], torch.rand(3, generator=torch.Generator().manual_seed(2)))
    source = ImageGenerators(seeded(1, 2))
    flat = uniform((5,), source, torch.device("cpu"), images=torch.tensor([1, 0, 1, -1, 1]))
    one, two = torch.rand(1, generator=seeded(1)[0]), torch.rand(3, generator=seeded(2)[0])
    assert torch.equal(flat, torch.stack([two[0], one[0], two[1], torch.tensor(0.0), two[2]]))
    single = torch.Generator().manual_seed(3)
    assert torch.equal(
        uniform((5,), single, torch.device("cpu"), images=torch.tensor([1, 0, 1, -1, 1])),
        torch.rand(5, generator=torch.Generator().manual_seed(3)),
    )
    probs = torch.softmax(torch.randn(2, 4, 6), -1)
    tokens = sample(probs, ImageGenerators(seeded(4, 5)))
    assert torch.equal(tokens[1], sample(probs[1:], ImageGenerators(seeded(5)))[0])
    frozen, _, _ = verify_round(tokens, probs, probs.roll(1, -1), ImageGenerators(seeded(4, 5)), torch.tensor([-1, 1]))
    alone, _, _ = verify_round(tokens[1:], probs[1:], probs[1:].roll(1, -1), ImageGenerators(seeded(5)))
    assert torch.equal(frozen[1], alone[0])


# The bundled reference model: 16 x 16 codes, guidance 3. A few rows per image keep each test to seconds; the rows
# a callback has seen are final, so the first rows of a stopped call are those of the whole call.
REFERENCE_PROMPTS = [
    "a red circle left of a blue square",
    "three green triangles",
    "a yellow square",
    "two small purple circles above a large orange ring",
]


@pytest.fixture(scope="module")
def reference():
    pipe = SSDAutoregressivePipeline.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def first_rows(pipe, prompts, generator, rows, **options):
    def stop(p, row, timestep, tensors):
        if row == rows - 1:
            p._interrupt = True
        return {}

    out = pipe(prompts, generator=generator, output_type="latent", callback_on_step_end=stop, **options)
    assert out.rows_completed == rows
    return out.codes[:, :rows]


@pytest.mark.parametrize(
    "decoding, options, rows",
    [("ar", {}, 2), ("exact", {}, 3), ("ssd", {}, 5), ("ssd", {"verify_rounds": 8}, 4), ("ssd", {"window": 17}, 4)],
)
def test_on_the_reference_model_an_image_in_a_batch_equals_it_alone(reference, decoding, options, rows):
    seeds = [31, 32, 33, 34]
    batch = first_rows(reference, REFERENCE_PROMPTS, seeded(*seeds), rows, decoding=decoding, **options)
    for i, (prompt, seed) in enumerate(zip(REFERENCE_PROMPTS, seeds)):
        alone = first_rows(reference, prompt, torch.Generator().manual_seed(seed), rows, decoding=decoding, **options)
        assert torch.equal(batch[i], alone[0]), i


@pytest.mark.parametrize("drafter", ["inrow", "recurrent"])
def test_exact_re_proposals_draw_an_image_in_a_batch_as_alone(monkeypatch, drafter):
    """Re-proposals draw per image too (each image's accept/resample noise from its own generator)."""
    backbone = tiny_backbone(rows=4, cols=4, codebook_size=8)
    heads = tiny_heads(backbone, drafter=drafter)
    with torch.no_grad():
        heads.vertical[0].left.weight.mul_(8)  # drafts that depend strongly on the codes to their left
    in_row = SSDAutoregressivePipeline(backbone.model, backbone.tokenizer, tiny_vqvae(8), heads)
    in_row.set_progress_bar_config(disable=True)
    moved = []
    right = FrontierRun._repropose

    def spy(self, *args):
        out = right(self, *args)
        moved.append(int(out[2].sum()))
        return out

    monkeypatch.setattr(FrontierRun, "_repropose", spy)
    seeds = [3, 4, 5]
    batch = codes(in_row, PROMPTS[:3], seeded(*seeds), decoding="exact")
    for i, (prompt, seed) in enumerate(zip(PROMPTS[:3], seeds, strict=True)):
        assert torch.equal(batch[i], codes(in_row, prompt, seeded(seed), decoding="exact")[0]), i
    assert sum(moved) > 0  # some codes were moved by re-proposals
