"""The Hub folders of the drafting heads we will publish for Janus-Pro-7B, Emu3-Gen and Lumina-mGPT-7B-768.

Each folder (hub_cards/ssd-heads-*) holds the heads' config.json, which names the
base checkpoint so that `from_pretrained` on the heads repository fetches it,
and a model card made with `huggingface_hub.ModelCard`: the exact training
command, what it needs, and the status. There are no weights until the heads are
trained; the card says so, and loading the repository says so too.

    python -m ssd_pipelines.publishing.heads_cards --out hub_cards
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub import ModelCard, ModelCardData

from ..heads import DraftHeads

ORGANIZATION = "ssd-pipelines"
PROMPTS = "coco2017_train_captions.txt"
PROMPT_RECIPE = (
    "`jq -r '.annotations[].caption' annotations/captions_train2017.json | "
    "shuf -n {count} --random-source=<(yes) > " + PROMPTS + "` (COCO 2017 train captions, one per line)"
)
PROCESSES = 8
# The vertical drafter, chosen on the reference model's ablation (docs/drafters.md): the drafter that reads the row
# above, the codes drafted to its left and its own state there takes the most drafts and the best look.
DRAFTER = "recurrent"


@dataclass(frozen=True)
class HeadsRepository:
    """What a heads card states; sizes are the base model's (its config.json)."""

    name: str  # the repository, under ORGANIZATION
    base_model: str
    model: str  # as the card names it
    hidden_size: int  # = the input embedding size of image codes
    codebook_size: int
    grid: tuple[int, int]  # rows, cols at the default size
    pixels: tuple[int, int]
    end_of_line: bool
    guidance: float
    sampling: str  # distillation sampling options beyond temperature 1 and guidance
    prompts: int  # images distilled from, one per prompt
    generate_batch_size: int
    steps: int
    batch_size: int
    gpu_hours: int  # estimated
    load_options: str  # beyond dtype and device_map, in the card's snippet
    notes: str

    @property
    def repo_id(self) -> str:
        return f"{ORGANIZATION}/{self.name}"

    def heads(self) -> DraftHeads:
        """The heads' module on the meta device: config and parameter count, no memory."""
        with torch.device("meta"):
            return DraftHeads(
                self.hidden_size,
                self.hidden_size,
                self.codebook_size,
                vertical_offsets=(1,),
                base_model=self.base_model,
                vertical_drafter=DRAFTER,
            )

    def training_command(self) -> str:
        lines = [
            f"accelerate launch --multi_gpu --num_processes {PROCESSES} -m ssd_pipelines.training.distill",
            f"--model {self.base_model} --dtype bfloat16",
            f"--prompts {PROMPTS} --images-per-prompt 1 --generate-batch-size {self.generate_batch_size}",
            f"--guidance {self.guidance:g} --temperature 1.0{self.sampling}",
            f"--horizontal 5 --vertical 1 --vertical-drafter {DRAFTER} --loss kl",
            f"--steps {self.steps} --batch-size {self.batch_size} --lr 1e-3 --schedule cosine",
            f"--base-model {self.base_model} --out runs/{self.name}",
        ]
        return " \\\n    ".join(lines)

    def hidden_state_gib_per_process(self) -> float:
        """CPU memory of the distillation data: every cell's state in both guidance branches, in bf16."""
        cells = self.grid[0] * self.grid[1]
        return self.prompts / PROCESSES * cells * 2 * self.hidden_size * 2 / 2**30


REPOSITORIES = [
    HeadsRepository(
        name="ssd-heads-janus-pro-7b",
        base_model="deepseek-community/Janus-Pro-7B",
        model="Janus-Pro-7B",
        hidden_size=4096,
        codebook_size=16384,
        grid=(24, 24),
        pixels=(384, 384),
        end_of_line=False,
        guidance=5.0,
        sampling="",
        prompts=8192,
        generate_batch_size=16,
        steps=2000,
        batch_size=16,
        gpu_hours=6,
        load_options="",
        notes="Janus-Pro makes 384 x 384 images only.",
    ),
    HeadsRepository(
        name="ssd-heads-emu3-gen",
        base_model="BAAI/Emu3-Gen-hf",
        model="Emu3-Gen",
        hidden_size=4096,
        codebook_size=32768,
        grid=(90, 90),
        pixels=(720, 720),
        end_of_line=True,
        guidance=3.0,
        sampling=" --top-k 2048",
        prompts=2048,
        generate_batch_size=8,
        steps=1000,
        batch_size=4,
        gpu_hours=20,
        load_options="",
        notes="Emu3 makes any size in multiples of 8 px; the heads are trained at its default 720 x 720.",
    ),
    HeadsRepository(
        name="ssd-heads-lumina-mgpt-7b-768",
        base_model="Alpha-VLLM/Lumina-mGPT-7B-768",
        model="Lumina-mGPT-7B-768",
        hidden_size=4096,
        codebook_size=8192,
        grid=(48, 48),
        pixels=(768, 768),
        end_of_line=True,
        guidance=4.0,
        sampling=" --top-k 2000",
        prompts=4096,
        generate_batch_size=16,
        steps=1500,
        batch_size=8,
        gpu_hours=8,
        load_options=', vqvae=load_chameleon_vqgan("chameleon/tokenizer")',
        notes=(
            "Images need Meta's Chameleon image tokenizer (vqgan.yaml, vqgan.ckpt), a licensed download from "
            "https://ai.meta.com/resources/models-and-libraries/chameleon-downloads/: pass its folder to "
            "`ssd_pipelines.backbones.chameleon_vqgan.load_chameleon_vqgan`. Without it the pipeline returns codes "
            '(`output_type="latent"`). Training needs no VQ decoder.'
        ),
    ),
]

CARD = """---
{card_data}
---

# {name}

Drafting heads for [Spatially Speculative Decoding](https://arxiv.org/abs/2606.20543) (SSD) of
[{model}](https://huggingface.co/{base_model}), for the ssd-pipelines library
(`SSDAutoregressivePipeline`).

## Status

**Weights not trained yet.** This repository holds the heads' `config.json` only; loading it fails, saying so,
until the weights are trained with the command below and published here.

## Use (once trained)

```python
import torch
from ssd_pipelines import SSDAutoregressivePipeline{import_line}

pipe = SSDAutoregressivePipeline.from_pretrained(
    "{repo_id}", dtype=torch.bfloat16, device_map="auto"{load_options}
)  # fetches {base_model} as the backbone
out = pipe("a red fox in the snow", generator=torch.Generator().manual_seed(0))  # lossless; decoding="ssd" is faster
out.images[0].save("fox.png")
```

{notes}

## Heads

| | |
|---|---|
| base model | `{base_model}`, {grid[0]} x {grid[1]} codes{eol} at {pixels[0]} x {pixels[1]} px |
| offsets | horizontal (0, +1) .. (0, +5) for the first row, vertical (+1, 0) for every row below |
| sizes | hidden {hidden} + code embedding {hidden} -> {hidden}, SwiGLU {intermediate}, codebook {codebook} |
| parameters | {parameters:.2f} B (5 horizontal heads, 1 row drafter) |
| drafter | recurrent (`vertical_drafter="recurrent"`): each cell of a row reads 5 cells of the row above, the 2 codes drafted to its left and the state it predicted there, so a row is drafted left to right |

Why this drafter: on the reference model, against the per-cell heads shipped with it, it takes more first
drafts (0.54 against 0.31 with `ssd` r=2), draws fewer fragments (Fréchet distance 295 against 653, AR's 83) and
lets `exact` finish in fewer passes (74 against 85; docs/drafters.md, 800 images a decoding). What it costs: a
row's {grid[1]} steps run one after another, each reading the step's weights again (at Janus-Pro-7B's shape 11.6 GB
a row against 14 GB a backbone pass; docs/decoding.md, "Drafters that see their row"); on the reference model's
CPU drafting takes 21-35% of a call. The paper's per-cell heads train with the same
command given `--vertical 2 --vertical-drafter cell --loss smooth_l1`.

## Training

Self-distillation (`ssd_pipelines.training.distill`): the frozen backbone draws {prompts:,} images with AR at
guidance {guidance:g}; each head learns the last-layer state it sees at its offset, judged as the verifier judges
it: KL(p || q) between the distributions the true and the predicted state make through the backbone's own norm
and output head, guided as at inference. On {processes} GPUs of 80 GB:

```bash
{command}
```

- Prompts: {prompt_recipe}.
- Memory: each process keeps the states of its images on the CPU, {memory:.0f} GiB (bf16).
- Time: about {gpu_hours} GPU-hours on H100s, estimated from the cost of a forward pass, not measured.
"""


def card(repo: HeadsRepository) -> ModelCard:
    heads = repo.heads()
    data = ModelCardData(
        base_model=repo.base_model,
        library_name="ssd-pipelines",
        license="apache-2.0",
        pipeline_tag="text-to-image",
        tags=["autoregressive", "speculative-decoding", "ssd", "text-to-image"],
    )
    lumina = "chameleon" in repo.load_options
    return ModelCard(
        CARD.format(
            card_data=data.to_yaml(),
            name=repo.name,
            repo_id=repo.repo_id,
            model=repo.model,
            base_model=repo.base_model,
            import_line="\nfrom ssd_pipelines.backbones.chameleon_vqgan import load_chameleon_vqgan" if lumina else "",
            load_options=repo.load_options,
            notes=repo.notes,
            grid=repo.grid,
            eol=" (and an end-of-line token per row)" if repo.end_of_line else "",
            pixels=repo.pixels,
            hidden=repo.hidden_size,
            intermediate=heads.config.intermediate_size or 2 * repo.hidden_size,
            codebook=repo.codebook_size,
            parameters=sum(p.numel() for p in heads.parameters()) / 1e9,
            prompts=repo.prompts,
            guidance=repo.guidance,
            processes=PROCESSES,
            command=repo.training_command(),
            prompt_recipe=PROMPT_RECIPE.format(count=repo.prompts),
            memory=repo.hidden_state_gib_per_process(),
            gpu_hours=repo.gpu_hours,
        )
    )


def write(repo: HeadsRepository, out: Path) -> None:
    """config.json (the heads' diffusers config, naming the base model) and README.md."""
    folder = out / repo.name
    repo.heads().save_config(folder)
    card(repo).save(folder / "README.md")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("hub_cards"))
    args = parser.parse_args(argv)
    for repo in REPOSITORIES:
        write(repo, args.out)
        print(f"{args.out / repo.name}: {repo.repo_id}, base model {repo.base_model}")


if __name__ == "__main__":
    main()
