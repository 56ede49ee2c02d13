"""Probe (a record, not part of the package): what do heads distilled from the float32 backbone lose on a quantized one?

The reference model's heads were distilled from its float32 backbone. Here the same heads draft for the backbone in
float32, in int8 (torchao weight-only, `--dtype int8`) and in 4 bits (torchao's int4 weight-only, groups of 16, as
688 = 43 x 16: every linear layer in 4 bits, where `--dtype nf4` on a CPU with AVX512-BF16 keeps the MLPs, 688
wide, in float32). Each held-out prompt is drawn once per precision, seed = its index, with `ar`, `exact` (lossless
against the backbone it runs on) and `ssd` r=2; the table gives the passes, each decoding's acceptance of first
drafts, and the share of images the evaluator passes, with its standard error. `ar` draws one uniform a cell, so
its images on two backbones with nearly the same distributions are nearly the same images: its row measures what
quantizing costs the images, while `exact`'s samples part early (its draws follow its acceptances) and differ by
sampling noise as well.

Adherence moves with the samples as well as with the model. So the second table measures the quantized backbone
itself: on the float32 backbone's `exact` images, teacher-forced, the KL divergence of each cell's code
distribution from the float32 one's (conditional, and guided at the model's scale 3) and how often their
likeliest codes agree.

    python docs/probes/quantized_acceptance.py --prompts 128

Result: docs/backbones.md, "Quantized backbones".
"""

import argparse

import numpy as np
import torch
from torchao.quantization import Int8WeightOnlyConfig, IntxWeightOnlyConfig
from torchao.quantization.granularity import PerGroup
from tqdm import tqdm
from transformers import TorchAoConfig

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.hub import default_model
from ssd_pipelines.reference.evaluator import evaluate
from ssd_pipelines.reference.scenes import HELDOUT_SEED_START, sample_scene

PRECISIONS = {
    "float32": None,
    "int8": TorchAoConfig(Int8WeightOnlyConfig(set_inductor_config=False)),
    "int4 (groups of 16)": TorchAoConfig(IntxWeightOnlyConfig(weight_dtype=torch.int4, granularity=PerGroup(16))),
}
DECODINGS = {
    "ar": {"decoding": "ar"},
    "exact": {"decoding": "exact"},
    "ssd r=2": {"decoding": "ssd", "verify_rounds": 2},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=48)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scenes = [sample_scene(HELDOUT_SEED_START + i) for i in range(args.prompts)]
    pipes, codes = {}, []
    print("| backbone | decoding | passes an image | first-draft acceptance | images passed |\n|---|---|---|---|---|")
    for precision, config in PRECISIONS.items():
        pipe = pipes[precision] = SSDAutoregressivePipeline.from_pretrained(default_model(), quantization_config=config)
        pipe.set_progress_bar_config(disable=True)
        for label, options in DECODINGS.items():
            passes, accepted, drafted, images = [], 0, 0, []
            for i, scene in enumerate(tqdm(scenes, desc=f"{precision}, {label}", leave=False)):
                out = pipe(scene.caption, generator=torch.Generator().manual_seed(i), output_type="np", **options)
                passes.append(out.stats["forward_passes"])
                accepted += sum(out.stats["accepted_per_round"][:1])
                drafted += sum(out.stats["drafted_per_round"][:1])
                images.append((out.images[0] * 255).round().astype("uint8"))
                if precision == "float32" and label == "exact":
                    codes.append(out.codes[0])
            passed = evaluate(images, [s.spec for s in scenes])["accuracy"]
            error = (passed * (1 - passed) / len(images)) ** 0.5
            acceptance = f"{accepted / drafted:.3f}" if drafted else "-"  # ar drafts nothing
            print(f"| {precision} | {label} | {np.mean(passes):.1f} | {acceptance} | {passed:.2f} ± {error:.2f} |")
    print(
        "\n| backbone | KL from float32, conditional | guided (3) | likeliest code agrees, guided |\n|---|---|---|---|"
    )
    reference = cell_logits(pipes["float32"], [s.caption for s in scenes], codes)
    for precision in list(PRECISIONS)[1:]:
        kl_cond, kl_guided, agree = drift(reference, cell_logits(pipes[precision], [s.caption for s in scenes], codes))
        print(f"| {precision} | {kl_cond:.4f} | {kl_guided:.4f} | {agree:.1%} |")


@torch.no_grad()
def cell_logits(pipe, prompts: list[str], codes: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The conditional and unconditional code logits [N, cells, K] of every image, teacher-forced in one pass each:
    prompt, BOI, then the rows of codes, each closed by EOL."""
    backbone = pipe.image_backbone
    tokens = backbone.tokens
    batch = backbone.encode_prompts(prompts, guidance=True)
    rows = []
    for grid in codes:
        with_eol = torch.cat([grid + tokens.code_offset, torch.full((grid.shape[0], 1), tokens.eol_token_id)], 1)
        rows.append(with_eol.flatten())
    image = torch.stack(rows).repeat(2, 1)  # conditional rows first, as in the prompt batch
    ids = torch.cat([batch.input_ids, image], 1)
    mask = torch.cat([batch.attention_mask, torch.ones_like(image)], 1)
    logits = pipe.backbone(input_ids=ids, attention_mask=mask).logits.float()
    width, cols = batch.input_ids.shape[1], codes[0].shape[1]
    predicts_code = [width - 1 + r * (cols + 1) + c for r in range(codes[0].shape[0]) for c in range(cols)]
    cells = logits[:, predicts_code, tokens.code_offset : tokens.code_offset + tokens.codebook_size]
    return cells.chunk(2)


def drift(reference, quantized, scale: float = 3.0) -> tuple[float, float, float]:
    """Mean KL(float32 || quantized) per cell, conditional and guided, and the agreement of the guided argmax."""

    def kl(p_logits, q_logits):
        p, q = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
        return (p.exp() * (p - q)).sum(-1).mean().item()

    (cond, uncond), (q_cond, q_uncond) = reference, quantized
    guided, q_guided = uncond + scale * (cond - uncond), q_uncond + scale * (q_cond - q_uncond)
    agree = (guided.argmax(-1) == q_guided.argmax(-1)).float().mean().item()
    return kl(cond, q_cond), kl(guided, q_guided), agree


if __name__ == "__main__":
    main()
