"""`from_pretrained(..., quantization_config=...)`: the backbone loaded quantized, as diffusers and transformers do it.

diffusers' pipelines take a `PipelineQuantizationConfig`, transformers' models their own config (`TorchAoConfig`,
`BitsAndBytesConfig`). Either form is accepted, for a pipeline folder and for a checkpoint alike: the backbone, a
transformers model, is then loaded by transformers with its own config. Only the backbone is quantized: the heads
and the VQ decoder are small beside it and stay in the pipeline's dtype.
"""

from __future__ import annotations

import torch
from diffusers import PipelineQuantizationConfig
from transformers.utils.quantization_config import QuantizationConfigMixin

from .precisions import check_precision, compute_dtype

QUANTIZABLE = ("backbone",)
NF4_CPU_BLOCK = 32  # bitsandbytes' CPU kernels pack a 4-bit weight's output rows by 32
EXAMPLE = (
    "e.g. PipelineQuantizationConfig(quant_mapping={'backbone': TorchAoConfig(Int8WeightOnlyConfig())}) or "
    "TorchAoConfig(Int8WeightOnlyConfig()) itself"
)


def backbone_quantization(config) -> QuantizationConfigMixin | None:
    """The transformers config that quantizes the backbone, from either form; a TypeError for another kind
    of object, a ValueError for a component other than the backbone."""
    if config is None or isinstance(config, QuantizationConfigMixin):
        return config
    if not isinstance(config, PipelineQuantizationConfig):
        raise TypeError(
            "quantization_config must be diffusers' PipelineQuantizationConfig or a transformers quantization config "
            f"for the backbone ({EXAMPLE}); got a {type(config).__name__}."
        )
    if not config.is_granular:  # diffusers' backend form: a backend and the components it applies to
        _check_components(config.components_to_quantize or [])
        return config._resolve_quant_config(is_diffusers=False, module_name="backbone")
    _check_components(list(config.quant_mapping))
    backbone = config.quant_mapping.get("backbone")
    if not isinstance(backbone, QuantizationConfigMixin):
        raise TypeError(
            "quantization_config's quant_mapping must map 'backbone' to a transformers quantization config (the "
            f"backbone is a transformers model), {EXAMPLE}; got a {type(backbone).__name__}."
        )
    return backbone


def _check_components(components: list[str]) -> None:
    others = sorted(set(components) - set(QUANTIZABLE))
    if others:
        raise ValueError(
            f"quantization_config may quantize the backbone only, not {', '.join(others)}: the heads and the VQ "
            "decoder are small beside it and stay in the pipeline's dtype (pass dtype= to change that)."
        )


def precision_options(name: str, device: str) -> dict:
    """`from_pretrained`'s dtype and quantization_config (and device_map for nf4 on a GPU, where bitsandbytes
    quantizes as it places) for a face's precision choice (`precisions.py`) on `device`."""
    device_type = torch.device(device).type
    check_precision(name, device_type)
    dtype = compute_dtype(name, device_type)
    options = {"dtype": dtype if dtype == "auto" else getattr(torch, dtype)}
    if name == "int8":
        from torchao.quantization import Int8WeightOnlyConfig
        from transformers import TorchAoConfig

        # set_inductor_config=False: torchao would otherwise retune inductor for the whole process (a ComfyUI server)
        options["quantization_config"] = TorchAoConfig(Int8WeightOnlyConfig(set_inductor_config=False))
    elif name == "nf4":
        from transformers import BitsAndBytesConfig

        options["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=options["dtype"]
        )
        if device_type != "cpu":
            options["device_map"] = {"": device}
    return options


def check_runs_on_cpu(model: torch.nn.Module, name: str) -> None:
    """bitsandbytes' CPU kernels assert, at the first pass, that a 4-bit layer's output width is a multiple of 32:
    refuse such a backbone when it is loaded, with what to choose instead."""
    misfits = [
        (path, module.out_features)
        for path, module in model.named_modules()
        if type(module).__name__ == "Linear4bit"
        and module.weight.device.type == "cpu"
        and module.out_features % NF4_CPU_BLOCK
    ]
    if misfits:
        path, width = misfits[0]
        raise ValueError(
            f"the backbone of {name} cannot run in 4 bits on the CPU: bitsandbytes' CPU kernels need each quantized "
            f"layer's output width to be a multiple of {NF4_CPU_BLOCK}, and {len(misfits)} layers are not "
            f"({path}: {width}). Choose int8 (torchao) on the CPU, or run nf4 on a CUDA GPU."
        )
