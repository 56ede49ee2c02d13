"""The reference training data as caption word ids and VQ codes, with a cache on disk.

Rendering and VQ-encoding 30,000 scenes takes about 4 minutes on 2 CPU cores, and
every training run used to redo it. `cached_scenes` encodes once and keeps the
captions and codes in a safetensors file tagged with the seeds and a fingerprint
of the VQ weights and caption vocabulary, so a later run, or a run on another
machine, reads them back in a second and can never pick up codes of another VQ.

On a GPU machine the VQ encoder is fast and rendering (under a millisecond a scene)
is what waits: `workers` renders in that many processes while the VQ encodes.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from diffusers import VQModel
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from transformers import PreTrainedTokenizerBase

from ..reference.scenes import sample_scene
from ..vq import encode_images


@dataclass
class EncodedScenes:
    """Captions as word ids (no specials) and images as VQ codes [N, 16, 16]."""

    captions: list[list[int]]
    codes: torch.Tensor


def render_batch(seeds: Sequence[int]) -> tuple[list[str], np.ndarray]:
    """Captions and stacked uint8 images of these seeds' scenes (a worker's unit of work)."""
    scenes = [sample_scene(s) for s in seeds]
    return [s.caption for s in scenes], np.stack([s.image for s in scenes])


def rendered_batches(seeds: Sequence[int], batch_size: int, workers: int) -> Iterator[tuple[list[str], np.ndarray]]:
    """The scenes in order, `batch_size` at a time, rendered here or by `workers` spawned processes."""
    batches = [seeds[start : start + batch_size] for start in range(0, len(seeds), batch_size)]
    if workers <= 1:
        yield from map(render_batch, batches)
        return
    # spawn, not fork: the parent may already hold a CUDA context, which a forked child must not inherit.
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        yield from pool.imap(render_batch, batches)


def encode_scenes(
    vq: VQModel, tokenizer: PreTrainedTokenizerBase, seeds: Sequence[int], batch_size: int = 256, workers: int = 1
) -> EncodedScenes:
    captions, codes = [], []
    for texts, images in rendered_batches(seeds, batch_size, workers):
        captions += tokenizer(texts, add_special_tokens=False)["input_ids"]
        codes.append(encode_images(vq, images).cpu())
    return EncodedScenes(captions, torch.cat(codes))


def source_fingerprint(vq: VQModel, tokenizer: PreTrainedTokenizerBase) -> str:
    """sha256 over the VQ weights and the caption vocabulary: what the codes and word ids depend on."""
    digest = hashlib.sha256(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    for name, tensor in sorted(vq.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def seeds_tag(seeds: Sequence[int]) -> str:
    """How a cache names its seeds: "start-stop" for a range, else their count and a digest."""
    if isinstance(seeds, range) and seeds.step == 1:
        return f"{seeds.start}-{seeds.stop}"
    digest = hashlib.sha256(np.asarray(seeds, dtype=np.int64).tobytes()).hexdigest()[:16]
    return f"{len(seeds)} seeds, sha256 {digest}"


def save_scenes(data: EncodedScenes, path: Path, seeds: Sequence[int], fingerprint: str) -> None:
    lengths = torch.tensor([len(c) for c in data.captions], dtype=torch.int32)
    captions = torch.full((len(data.captions), int(lengths.max())), -1, dtype=torch.int32)
    for row, caption in enumerate(data.captions):
        captions[row, : len(caption)] = torch.tensor(caption, dtype=torch.int32)
    tensors = {"captions": captions, "caption_lengths": lengths, "codes": data.codes.to(torch.int16)}
    metadata = {"seeds": seeds_tag(seeds), "source": fingerprint}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata=metadata)


def load_scenes(path: Path, seeds: Sequence[int], fingerprint: str) -> EncodedScenes:
    """Read a cache; refuse one written for other seeds, another VQ or another caption vocabulary."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in ("captions", "caption_lengths", "codes")}
    except (SafetensorError, OSError, KeyError) as error:
        raise ValueError(
            f"{path} is not a readable scene cache ({error}): delete it to encode the scenes again"
        ) from error
    if metadata.get("source") != fingerprint:
        raise ValueError(
            f"{path} was encoded by another VQ or caption vocabulary than this run's: "
            "pass another --scene-cache path, or delete it to encode again"
        )
    wanted = seeds_tag(seeds)
    if metadata.get("seeds") != wanted:
        raise ValueError(
            f"{path} holds the scenes of seeds {metadata.get('seeds')}, not this run's {wanted}: "
            "pass another --scene-cache path"
        )
    captions = [row[:length].tolist() for row, length in zip(tensors["captions"], tensors["caption_lengths"])]
    return EncodedScenes(captions, tensors["codes"].long())


def cached_scenes(
    vq: VQModel, tokenizer: PreTrainedTokenizerBase, seeds: Sequence[int], cache: Path | None = None, workers: int = 1
) -> EncodedScenes:
    """The scenes of `seeds`, read from `cache` when it exists, else encoded (and written there if given)."""
    if cache is None:
        return encode_scenes(vq, tokenizer, seeds, workers=workers)
    fingerprint = source_fingerprint(vq, tokenizer)
    if cache.exists():
        return load_scenes(cache, seeds, fingerprint)
    data = encode_scenes(vq, tokenizer, seeds, workers=workers)
    save_scenes(data, cache, seeds, fingerprint)
    return data
