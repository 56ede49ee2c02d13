"""Assemble the reference model's Hub folder: the pipeline in fp16 safetensors and its model card.

    python -m ssd_pipelines.publishing.reference --backbone runs/backbone --vqvae runs/vqvae \
        --heads runs/heads --benchmark docs/reference_benchmark.md --out hub_cards/ssd-reference
    # new heads for the published backbone: the rest is taken from the pipeline as it is
    python -m ssd_pipelines.publishing.reference --pipeline hub_cards/ssd-reference --heads runs/heads6
    # the card alone, after the training notes or the benchmark changed: no weights are written
    python -m ssd_pipelines.publishing.reference --card-only --out hub_cards/ssd-reference

The card is built with `huggingface_hub.ModelCard` from the training logs and the
benchmark table, so every number in it comes from a command anyone can rerun.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import torch
from diffusers import VQModel
from huggingface_hub import ModelCard, ModelCardData
from transformers import AutoTokenizer, LlamaForCausalLM

from ..heads import DraftHeads
from ..pipeline_ssd import SSDAutoregressivePipeline

REPO_ID = "ssd-pipelines/ssd-reference"

CARD_TEMPLATE = """---
{card_data}
---

# ssd-reference

A small text-to-image autoregressive model, trained from scratch by the ssd-pipelines project
(on a CPU, then for 5 minutes on one GPU), with drafting heads for
Spatially Speculative Decoding (SSD). It writes a 64 x 64 image as 16 x 16 VQ codes after a caption:
`[BOS, caption, BOI, 16 x (16 codes, EOL), EOI]`, like Emu3 and Lumina-mGPT do at scale.

It exists so that the library, its benchmarks and demos run offline on real trained weights.
It draws shapes, not photographs.

## Use

```python
import torch
from ssd_pipelines import SSDAutoregressivePipeline

torch.set_num_threads(1)  # on a CPU: a small model gains little from more threads, and loses much on a busy machine
pipe = SSDAutoregressivePipeline.from_pretrained("{repo_id}", dtype=torch.float32)
out = pipe("a red circle left of a blue square", generator=torch.Generator().manual_seed(0))
out.images[0].save("out.png")  # decoding="auto": lossless, the model's own distribution in fewer passes
fast = pipe("a red circle left of a blue square", decoding="ssd", verify_rounds=2)  # lossy, fewest passes
```

## Components

| folder | what | parameters |
|---|---|---|
| backbone | `LlamaForCausalLM`, {layers} layers x {hidden} hidden | {backbone_params} |
| tokenizer | word-level caption tokenizer ({vocab} words and specials) | - |
| vqvae | diffusers `VQModel`, 64 x 64 -> 16 x 16 codes, codebook {codebook} | {vq_params} |
| heads | SSD drafting heads: horizontal offsets {horizontal}, vertical offsets {vertical} | {heads_params} |

Weights are fp16 safetensors; load with `dtype=torch.float32` on CPU.

## Training data

Procedural 64 x 64 scenes (`ssd_pipelines.reference.scenes`): 1-4 objects of 4 shapes, 8 colours, two sizes,
on textured backgrounds, captioned with GenEval's task types (single object, two objects, counting, colours,
position, colour attribution). Seeds below 10^9 train; seeds from 10^9 are held out.

## Training

{training}

## Evaluation

{benchmark}
"""


RELATIVE_LINK = re.compile(r"(\]\()(?!https?://|#|/)([^)\s]+)(\))")


def relink(markdown: str, source: Path, folder: Path) -> str:
    """Markdown written in `source`'s folder, with its relative links rewritten to resolve from `folder`."""

    def moved(match: re.Match) -> str:
        target, _, anchor = match[2].partition("#")
        new = Path(os.path.relpath(source.parent / target, folder)).as_posix()
        return f"{match[1]}{new}{'#' + anchor if anchor else ''}{match[3]}"

    return RELATIVE_LINK.sub(moved, markdown)


def parameters(module: torch.nn.Module) -> str:
    return f"{sum(p.numel() for p in module.parameters()) / 1e6:.2f}M"


def build_card(pipe: SSDAutoregressivePipeline, training: str, benchmark: str) -> ModelCard:
    data = ModelCardData(
        license="apache-2.0",
        library_name="ssd-pipelines",
        pipeline_tag="text-to-image",
        tags=["autoregressive", "speculative-decoding", "ssd", "text-to-image", "vq"],
    )
    backbone = pipe.backbone.config
    return ModelCard(
        CARD_TEMPLATE.format(
            card_data=data.to_yaml(),
            repo_id=REPO_ID,
            layers=backbone.num_hidden_layers,
            hidden=backbone.hidden_size,
            backbone_params=parameters(pipe.backbone),
            vocab=len(pipe.tokenizer),
            codebook=pipe.vqvae.config.num_vq_embeddings,
            vq_params=parameters(pipe.vqvae),
            horizontal=list(pipe.heads.config.horizontal_offsets),
            vertical=list(pipe.heads.config.vertical_offsets),
            heads_params=parameters(pipe.heads),
            training=training,
            benchmark=benchmark,
        )
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", type=Path, help="take backbone, tokenizer and VQ model from this pipeline")
    parser.add_argument("--backbone", type=Path, help="folder with backbone/ and tokenizer/ (without --pipeline)")
    parser.add_argument("--vqvae", type=Path, help="VQ model folder (without --pipeline)")
    parser.add_argument("--heads", type=Path, help="the heads to publish (not with --card-only)")
    parser.add_argument("--card-only", action="store_true", help="rebuild the card of the pipeline in --out, alone")
    parser.add_argument("--training", type=Path, default=Path("docs/reference_training.md"), help="training notes")
    parser.add_argument("--benchmark", type=Path, default=Path("docs/reference_benchmark.md"), help="benchmark table")
    parser.add_argument("--out", type=Path, default=Path("hub_cards/ssd-reference"))
    args = parser.parse_args(argv)
    if args.card_only:
        if args.pipeline or args.backbone or args.vqvae or args.heads:
            parser.error("--card-only rebuilds the card of the pipeline in --out: pass no weights")
        write_card(SSDAutoregressivePipeline.from_pretrained(args.out), args)
        return
    if args.heads is None:
        parser.error("pass --heads, or --card-only to rebuild the card alone")
    if (args.pipeline is None) == (args.backbone is None or args.vqvae is None):
        parser.error("pass either --pipeline, or both --backbone and --vqvae")

    if args.pipeline is not None:
        pipe = SSDAutoregressivePipeline.from_pretrained(args.pipeline)  # in memory: --out may be the same folder
        pipe.heads = None
    else:
        pipe = SSDAutoregressivePipeline(
            backbone=LlamaForCausalLM.from_pretrained(args.backbone / "backbone"),
            tokenizer=AutoTokenizer.from_pretrained(args.backbone / "tokenizer"),
            vqvae=VQModel.from_pretrained(args.vqvae, use_safetensors=True),
        )
    heads = DraftHeads.from_pretrained(args.heads, use_safetensors=True)
    heads.register_to_config(base_model=REPO_ID)
    pipe.load_heads(heads)
    pipe.to(torch.float16).save_pretrained(args.out)
    write_card(pipe, args)
    sizes = {p.relative_to(args.out).as_posix(): p.stat().st_size for p in sorted(args.out.rglob("*")) if p.is_file()}
    print(json.dumps({"bytes": sum(sizes.values()), "files": sizes}, indent=1))


def write_card(pipe: SSDAutoregressivePipeline, args: argparse.Namespace) -> None:
    """The card in --out, from the training notes and the benchmark table (their titles dropped, links kept)."""
    sections = [
        relink(p.read_text().split("\n", 2)[-1], p, args.out) if p.is_file() else "(not measured yet)"
        for p in (args.training, args.benchmark)
    ]
    build_card(pipe, *sections).save(args.out / "README.md")


if __name__ == "__main__":
    main()
