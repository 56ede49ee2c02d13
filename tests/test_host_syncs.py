"""Host syncs (issue 39): what the counter counts, and the decoding engines held to their budgets of them.

On a GPU each sync stops the host from queueing the next pass, so an engine that reads the device every pass runs
at the speed of its launches. The budgets are the issue's: `ar` none until the end of the call; `exact` and `ssd`
pipelined on the window at most one a forward pass; `ssd` in row blocks at most one a verification round."""

import threading

import pytest
import torch
from transformers.utils.generic import to_py_obj

from ssd_pipelines import ARDecoding, ExactDecoding, SamplingConfig, SSDAutoregressivePipeline, SSDDecoding
from ssd_pipelines.hub import BUNDLED_MODEL
from ssd_pipelines.testing import tiny_heads
from ssd_pipelines.testing.host_syncs import count_host_syncs

HERE = ("tests",)  # count this file's own calls
x = torch.arange(12.0).view(3, 4)
scalar, index, mask = torch.tensor(1), torch.tensor([0, 2]), x > 5
generator = torch.Generator()

SYNCS = {  # each is one sync of its kind
    "item": [lambda: scalar.item(), lambda: x[scalar], lambda: x[:, scalar:], lambda: torch.full((2,), scalar)],
    "tolist": [lambda: x.tolist()],
    "bool": [lambda: bool(scalar), lambda: 1 if mask.any() else 0, lambda: torch.equal(x, x)],
    "int": [lambda: int(scalar), lambda: [1, 2][scalar], lambda: range(scalar)],
    "float": [lambda: float(scalar)],
    "cpu": [lambda: x.cpu(), lambda: x.to("cpu"), lambda: x.to(device="cpu", dtype=torch.half), lambda: repr(x)],
    "numpy": [lambda: x.numpy()],
    "h2d": [
        lambda: torch.tensor([1, 2], device=x.device),
        lambda: torch.as_tensor([1.0], device=x.device),
        lambda: x.new_tensor([1, 2]),
        lambda: x[[0, 2]],
        lambda: x[:, [0, 2]],
        lambda: x[torch.tensor([0, 2])],  # an index made on the host goes to the device
        lambda: torch.arange(3).to(x.device),
        lambda: torch.rand(3, generator=generator, device=generator.device).to(x.device),  # a CPU generator's draw
    ],
    "nonzero": [lambda: x[mask], lambda: mask.nonzero(), lambda: torch.where(mask), lambda: x.unique()],
}


@pytest.mark.parametrize("kind, call", [(kind, call) for kind, calls in SYNCS.items() for call in calls])
def test_each_kind_is_counted_once_at_its_site(kind, call):
    with count_host_syncs(HERE) as syncs:
        call()
    assert syncs.counts == {kind: 1}, syncs.summary()
    assert [site.split(":")[0] for site in syncs.sites] == ["tests/test_host_syncs.py"]
    assert syncs.total == 1 and syncs.per(4) == 0.25


NOT_SYNCS = [  # device work, or reads of what the host made itself
    lambda: x + 1,
    lambda: x * scalar,  # a 0-d tensor is an operand, not read
    lambda: mask.any(),
    lambda: torch.where(mask, x, 0.0),
    lambda: x.sum(),
    lambda: x[index],  # an index already on the device
    lambda: x[1:, 2],
    lambda: x.shape[0] + x.numel() + x.dim() + len(x),
    lambda: x.clone().__setitem__(mask, 0.0),  # a masked_fill_
    lambda: torch.arange(3, device=x.device).to(x.device, torch.long),
    lambda: int(torch.arange(3)[-1]) + torch.arange(4).tolist()[0],  # the host reads its own tensor
    lambda: torch.tensor([0, 2]).tolist(),
    lambda: x.to("cpu", non_blocking=True),
    lambda: x.repeat_interleave(2, dim=0),
]


@pytest.mark.parametrize("call", NOT_SYNCS)
def test_device_work_and_host_reads_of_host_tensors_are_not_counted(call):
    with count_host_syncs(HERE) as syncs:
        call()
    assert syncs.total == 0, syncs.summary()


def test_only_the_packages_calls_count_and_model_code_counts_at_its_own_site():
    with count_host_syncs() as syncs:  # ssd_pipelines: not this file, nor transformers called from it
        scalar.item(), to_py_obj(x)
    assert syncs.total == 0
    with count_host_syncs(HERE) as syncs:
        to_py_obj(x)
    assert syncs.counts == {"tolist": 1} and [s.split(":")[0] for s in syncs.sites] == ["transformers/utils/generic.py"]


def test_other_threads_and_torch_printing_inside_are_not_counted():
    worker = threading.Thread(target=lambda: (scalar.item(), x.tolist()))
    with count_host_syncs(HERE) as syncs:
        worker.start()
        worker.join()
        f"{x}"  # torch's printing reads every element: one copy to the host
    assert syncs.counts == {"cpu": 1}, syncs.summary()


@pytest.fixture(scope="module")
def reference():
    """The shipped model, its trained heads and random recurrent ones, and two prompts at guidance 3."""
    pipe = SSDAutoregressivePipeline.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    backbone = pipe.image_backbone
    heads = {"trained": pipe.heads, "recurrent": tiny_heads(backbone, drafter="recurrent")}
    sampling = SamplingConfig(guidance_scale=3.0, temperature=1.0)
    prompts = backbone.encode_prompts(["a red circle left of a blue square", "three green triangles"], guidance=True)
    return backbone, heads, prompts, sampling


STRATEGIES = {  # name: (the strategy from its heads, syncs allowed per forward pass, and more at most)
    "ar": (lambda heads: ARDecoding(), 0, 2),
    "exact": (ExactDecoding, 1, 3),
    "ssd pipelined": (lambda heads: SSDDecoding(heads, verify_rounds=2, window=17), 1, 3),
    "ssd": (lambda heads: SSDDecoding(heads, verify_rounds=2), 1, 3),  # one pass per verification round
}


@pytest.mark.parametrize("generators", ["one", "per image"])
@pytest.mark.parametrize(
    "decoding, heads",
    [("ar", None), ("exact", "trained"), ("ssd pipelined", "trained"), ("ssd", "trained")]
    + [("exact", "recurrent"), ("ssd", "recurrent")],
)
def test_decodings_keep_to_their_sync_budgets(reference, decoding, heads, generators):
    backbone, all_heads, prompts, sampling = reference
    make, per_pass, more = STRATEGIES[decoding]
    strategy = make(all_heads.get(heads))
    if generators == "one":
        generator = torch.Generator().manual_seed(0)
    else:
        generator = [torch.Generator().manual_seed(i) for i in range(2)]
    with count_host_syncs() as syncs:
        out = strategy.decode(backbone, prompts, sampling, generator=generator)
    passes = out.stats.forward_passes
    assert syncs.total <= per_pass * passes + more, f"{decoding}, {passes} passes: {syncs.summary()}"
