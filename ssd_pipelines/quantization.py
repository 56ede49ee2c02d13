"""`from_pretrained(..., quantization_config=...)`: the backbone loaded quantized, as diffusers and transformers do it.

diffusers' pipelines take a `PipelineQuantizationConfig`, transformers' models their own config (`TorchAoConfig`,
`BitsAndBytesConfig`). Either form is accepted, for a pipeline folder and for a checkpoint alike: the backbone, a
transformers model, is then loaded by transformers with its own config. Only the backbone is quantized: the heads
and the VQ decoder are small beside it and stay in the pipeline's dtype.
"""

from __future__ import annotations

import copy
import warnings

import torch
from diffusers import PipelineQuantizationConfig
from transformers.utils.quantization_config import QuantizationConfigMixin

from .precisions import check_precision, compute_dtype

QUANTIZABLE = ("backbone",)
NF4_CPU_ROWS = 32  # bitsandbytes' AVX512-BF16 kernels pack a 4-bit weight's output rows by 32
NF4_BLOCK = 64  # weights sharing one absmax in bitsandbytes' 4-bit layers, as transformers makes them
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


def repacks(in_features: int, out_features: int, block: int) -> bool:
    """Whether bitsandbytes' AVX512-BF16 CPU kernels can repack a 4-bit layer: rows by NF4_CPU_ROWS, and whole
    blocks of absmax along each row."""
    return out_features % NF4_CPU_ROWS == 0 and in_features % block == 0


def fit_nf4_to_cpu(model_class, folder, backbone_options: dict, name: str) -> dict:
    """`backbone_options` whose 4-bit bitsandbytes config leaves unquantized the linear layers that its AVX512-BF16
    CPU kernels cannot repack (`check_runs_on_cpu`), found on the model built without weights; a warning says how
    much stays in the compute dtype. Unchanged for other configs, other devices and other CPUs.

    Janus-Pro's generation aligner takes the VQ embedding, 8 wide: without this, nf4 could not run it on such a CPU.
    """
    config = backbone_options.get("quantization_config")
    placed = backbone_options.get("device_map")
    if not getattr(config, "load_in_4bit", False) or placed not in (None, "cpu", {"": "cpu"}):
        return backbone_options
    from bitsandbytes.functional import has_avx512bf16
    from transformers import AutoConfig
    from transformers.quantizers.base import get_keys_to_not_convert

    if not has_avx512bf16():
        return backbone_options
    with torch.device("meta"):
        skeleton = model_class._from_config(AutoConfig.from_pretrained(folder))
    # transformers leaves the output head out by default, but not once a skip list is given: name it too
    kept = set(config.llm_int8_skip_modules or get_keys_to_not_convert(skeleton))
    linears = {
        path: m
        for path, m in skeleton.named_modules()
        if isinstance(m, torch.nn.Linear) and not any(path == k or path.startswith(k + ".") for k in kept)
    }
    misfits = [path for path, m in linears.items() if not repacks(m.in_features, m.out_features, NF4_BLOCK)]
    if not misfits:
        return backbone_options
    share = sum(linears[p].weight.numel() for p in misfits) / sum(m.weight.numel() for m in linears.values())
    warnings.warn(
        f"nf4 on this CPU keeps {len(misfits)} of the {len(linears)} linear layers of the backbone of {name} "
        f"({share:.0%} of their weights) in the compute dtype: bitsandbytes' kernels for its AVX512-BF16 need a "
        f"4-bit layer's width to be a multiple of {NF4_CPU_ROWS} and its input's a multiple of {NF4_BLOCK} "
        f"({misfits[0]}: {linears[misfits[0]].in_features} -> {linears[misfits[0]].out_features} is not). "
        "int8 (torchao) quantizes them all on the CPU; a CUDA GPU runs them in 4 bits.",
        UserWarning,
        stacklevel=4,
    )
    fitted = copy.deepcopy(config)
    fitted.llm_int8_skip_modules = [*sorted(kept), *misfits]
    return {**backbone_options, "quantization_config": fitted}


def check_runs_on_cpu(model: torch.nn.Module, name: str) -> None:
    """On a CPU with AVX512-BF16, bitsandbytes repacks each 4-bit layer at its first pass, which asserts that the
    layer is a multiple of 32 wide and its input a multiple of its block (64): refuse such a backbone at load, with
    what to choose instead, rather than fail at the first pass. Other CPUs run bitsandbytes' generic path.
    `fit_nf4_to_cpu` keeps such layers out of the quantization when we load; a pipeline saved in 4 bits elsewhere
    may still hold them."""
    misfits = [
        f"{path}: {module.in_features} -> {module.out_features}"
        for path, module in model.named_modules()
        if type(module).__name__ == "Linear4bit"
        and module.weight.device.type == "cpu"
        and getattr(module, "support_avx512bf16_for_cpu", False)
        and not repacks(module.in_features, module.out_features, module.weight.quant_state.blocksize)
    ]
    if misfits:
        raise ValueError(
            f"the backbone of {name} cannot run in 4 bits on this CPU: bitsandbytes' kernels for its AVX512-BF16 "
            f"repack each 4-bit layer, which needs the layer's width to be a multiple of {NF4_CPU_ROWS} and its input's "
            f"a multiple of its block (64), and {len(misfits)} layers are not ({misfits[0]}). Choose int8 (torchao) "
            "on the CPU, or run nf4 on a CUDA GPU."
        )
