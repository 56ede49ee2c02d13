"""SSD Pipeline Loader: a pipeline from models/ssd/, a local folder or a Hub repository, loaded once and reused."""

from __future__ import annotations

import functools
from pathlib import Path

import comfy.model_management
import torch
from huggingface_hub.errors import LocalEntryNotFoundError

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.precisions import PRECISIONS, runnable_precisions
from ssd_pipelines.quantization import precision_options

from .model_folder import list_models, locate, models_folders

PIPELINE = "SSD_PIPELINE"
DEFAULT_DEVICE = "default"
NO_MODEL = "(no model in models/ssd: set path_or_repo_id)"


def dtype_choices() -> list[str]:
    """The precisions this machine runs on its CPU or its GPUs: int8 where torchao is installed, nf4 where
    bitsandbytes is (on the CPU from its version 0.50)."""
    return runnable_precisions(["cpu", *(["cuda"] if torch.cuda.is_available() else [])])


def device_choices() -> list[str]:
    """ComfyUI's device first; then the CPU and each GPU torch sees, for a pipeline placed elsewhere on purpose."""
    gpus = [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    return [DEFAULT_DEVICE, "cpu", *gpus]


class SSDPipelineLoader:
    DESCRIPTION = (
        "Loads an SSD pipeline (backbone, tokenizer, VQ decoder, drafting heads) once; later runs with the same "
        "inputs reuse it. Models are folders in ComfyUI/models/ssd/ (or the reference model this pack ships)."
    )
    CATEGORY = "SSD"
    FUNCTION = "load"
    RETURN_TYPES = (PIPELINE,)
    RETURN_NAMES = ("pipeline",)
    OUTPUT_TOOLTIPS = ("The loaded pipeline, for SSD Generate and SSD Decode Codes.",)

    @classmethod
    def INPUT_TYPES(cls) -> dict:
        return {
            "required": {
                "model": (
                    list_models() or [NO_MODEL],
                    {"tooltip": "A pipeline folder (model_index.json) or drafting heads folder in models/ssd/."},
                ),
                "dtype": (
                    dtype_choices(),
                    {
                        "default": "float32",
                        "tooltip": "Precision of the weights. "
                        + " ".join(f"{precision.name}: {precision.about}." for precision in PRECISIONS.values())
                        + " Quantized backbones compute in float32 on the CPU, bfloat16 on a GPU. The list holds "
                        "what this machine runs: int8 needs torchao, nf4 bitsandbytes.",
                    },
                ),
                "device": (
                    device_choices(),
                    {
                        "default": DEFAULT_DEVICE,
                        "tooltip": "Where the pipeline runs; 'default' is ComfyUI's device (the CPU with --cpu).",
                    },
                ),
            },
            "optional": {
                "path_or_repo_id": (
                    "STRING",
                    {
                        "default": "",
                        "tooltip": "Instead of `model`: a local folder or a Hugging Face Hub id (e.g. org/ssd-model). "
                        "Hub models download to the Hugging Face cache; offline, download them into models/ssd/ first.",
                    },
                ),
                "heads": (
                    "STRING",
                    {
                        "default": "",
                        "tooltip": "Empty: the pipeline's own drafting heads. Else other heads: a name in models/ssd/, "
                        "a local folder or a Hub id.",
                    },
                ),
            },
        }

    def load(
        self, model: str, dtype: str, device: str, path_or_repo_id: str = "", heads: str = ""
    ) -> tuple[SSDAutoregressivePipeline]:
        source = path_or_repo_id.strip() or locate(model)
        if source is None:
            raise ValueError(
                f"no SSD model {model!r} in {', '.join(models_folders())}: put a pipeline folder there, "
                "or set path_or_repo_id to a local folder or a Hub id."
            )
        heads = heads.strip()
        heads_source = (locate(heads) or heads) if heads else None
        target = comfy.model_management.get_torch_device() if device == DEFAULT_DEVICE else torch.device(device)
        return (load_pipeline(source, heads_source, dtype, str(target)),)


@functools.lru_cache(maxsize=2)
def load_pipeline(source: str, heads: str | None, dtype: str, device: str) -> SSDAutoregressivePipeline:
    """One pipeline per (source, heads, dtype, device); ComfyUI's own cache may drop a node's output, this does not.

    Two entries: an A/B graph over two models does not reload, and a third model frees the oldest.
    """
    try:
        pipe = SSDAutoregressivePipeline.from_pretrained(source, heads=heads, **precision_options(dtype, device))
    except ValueError as error:
        # Advice to download only where the Hub could not be reached; the library's own message says when a local
        # path does not exist, or a repository is not on the Hub.
        if not isinstance(error.__cause__, LocalEntryNotFoundError):
            raise
        hub_id = next(name for name in (source, heads) if name and not Path(name).is_dir())
        folder = Path(models_folders()[0]) / hub_id.split("/")[-1]
        raise ValueError(
            f"{error} For ComfyUI, download {hub_id} into its models folder (`hf download {hub_id} --local-dir "
            f"{folder}`), then pick {folder.name!r} as `model`, or type it in `heads` if it holds drafting heads."
        ) from error
    return pipe.to(device)
