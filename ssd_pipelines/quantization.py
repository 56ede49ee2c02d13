"""`from_pretrained(..., quantization_config=...)`: the backbone loaded quantized, as diffusers and transformers do it.

diffusers' pipelines take a `PipelineQuantizationConfig`, transformers' models their own config (`TorchAoConfig`,
`BitsAndBytesConfig`). Either form is accepted, for a pipeline folder and for a checkpoint alike: the backbone, a
transformers model, is then loaded by transformers with its own config. Only the backbone is quantized: the heads
and the VQ decoder are small beside it and stay in the pipeline's dtype.
"""

from __future__ import annotations

from diffusers import PipelineQuantizationConfig
from transformers.utils.quantization_config import QuantizationConfigMixin

QUANTIZABLE = ("backbone",)
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
