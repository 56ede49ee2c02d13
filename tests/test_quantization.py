"""`from_pretrained(..., quantization_config=...)` quantizes the backbone, in either of diffusers' and transformers'
forms; `exact` stays lossless with respect to the quantized backbone; options from_pretrained would not use are
refused, never ignored."""

from pathlib import Path

import bitsandbytes.functional as bnb_functional
import bitsandbytes.nn.modules as bnb_modules
import pytest
import torch
from diffusers import PipelineQuantizationConfig
from tiny_backbones import tiny_janus
from torchao.quantization import Int8Tensor, Int8WeightOnlyConfig, quantize_
from transformers import TorchAoConfig

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.decoding import ExactDecoding
from ssd_pipelines.quantization import precision_options
from ssd_pipelines.sampling_config import SamplingConfig
from ssd_pipelines.testing import tiny_pipeline
from ssd_pipelines.testing.exactness import TOY_PROMPT, grid_probabilities, measure, toy_setup

REFERENCE = Path(__file__).resolve().parents[1] / "hub_cards" / "ssd-reference"
INT8_WEIGHTS = Int8WeightOnlyConfig(set_inductor_config=False)  # torchao would retune inductor for later tests
INT8 = TorchAoConfig(INT8_WEIGHTS)


def greedy(pipe, decoding: str) -> torch.Tensor:
    pipe.set_progress_bar_config(disable=True)
    return pipe(["a red circle", "two blue squares"], decoding=decoding, temperature=0, output_type="latent").codes


def quantized_linears(model: torch.nn.Module) -> int:
    return sum(isinstance(m, torch.nn.Linear) and isinstance(m.weight, Int8Tensor) for m in model.modules())


@pytest.fixture(scope="module")
def reference_int8():
    return SSDAutoregressivePipeline.from_pretrained(REFERENCE, quantization_config=INT8)


def test_the_reference_backbone_is_quantized_and_heads_and_vq_decoder_are_not(reference_int8):
    pipe = reference_int8
    assert quantized_linears(pipe.backbone) > 0
    assert quantized_linears(pipe.heads) == 0 and quantized_linears(pipe.vqvae) == 0
    assert {p.dtype for p in pipe.heads.parameters()} == {torch.float32}


def test_exact_equals_ar_greedy_on_the_int8_reference_model(reference_int8):
    """Lossless with respect to the quantized backbone: the same greedy images as its own AR decoder."""
    assert torch.equal(greedy(reference_int8, "exact"), greedy(reference_int8, "ar"))


def test_diffusers_form_and_transformers_form_load_the_same_backbone(reference_int8):
    mapped = PipelineQuantizationConfig(quant_mapping={"backbone": INT8})
    pipe = SSDAutoregressivePipeline.from_pretrained(REFERENCE, quantization_config=mapped)
    assert quantized_linears(pipe.backbone) == quantized_linears(reference_int8.backbone)
    assert torch.equal(greedy(pipe, "ar"), greedy(reference_int8, "ar"))


def test_a_transformers_checkpoint_is_quantized_too(tmp_path):
    model, tokenizer = tiny_janus()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    pipe = SSDAutoregressivePipeline.from_pretrained(tmp_path, quantization_config=INT8)
    assert quantized_linears(pipe.backbone.model.language_model) > 0


def test_exact_samples_the_quantized_backbones_ar_distribution():
    """The G test of tests/test_decoding_distribution.py on the toy backbone with int8 weights: 30,000 images
    against the probabilities the quantized backbone itself gives."""
    backbone, heads = toy_setup()
    quantize_(backbone.decoder, INT8_WEIGHTS)
    assert quantized_linears(backbone.decoder) > 0
    sampling = SamplingConfig(temperature=1.0, guidance_scale=2.0)
    probs = grid_probabilities(backbone, TOY_PROMPT, sampling)
    g = measure(ExactDecoding(heads, window=4), backbone, sampling, 30_000, 3, probs).g
    assert g.passes, g


def test_save_pretrained_keeps_the_quantization(reference_int8, tmp_path):
    """transformers serializes torchao's and bitsandbytes' weights in safetensors, with the config that reloads them."""
    reference_int8.save_pretrained(tmp_path)
    again = SSDAutoregressivePipeline.from_pretrained(tmp_path)  # no quantization_config: the saved one
    assert quantized_linears(again.backbone) == quantized_linears(reference_int8.backbone)
    assert torch.equal(greedy(again, "exact"), greedy(reference_int8, "exact"))


@pytest.fixture
def cpu_kernels(monkeypatch):
    """Which of bitsandbytes' CPU paths 4-bit layers take: its AVX512-BF16 kernels (True), which repack each layer at
    its first pass and compute in bfloat16, or its generic path (False), in the compute dtype. Forcing True only
    loads: running those kernels needs the instructions."""

    def use(avx512_bf16: bool) -> None:
        monkeypatch.setattr(bnb_modules, "has_avx512bf16", lambda: avx512_bf16)
        monkeypatch.setattr(bnb_functional, "has_avx512bf16", lambda: avx512_bf16)

    return use


def linears_4bit(model: torch.nn.Module) -> int:
    return sum(type(m).__name__ == "Linear4bit" for m in model.modules())


def test_exact_equals_ar_greedy_on_the_nf4_reference_model(cpu_kernels):
    cpu_kernels(False)
    pipe = SSDAutoregressivePipeline.from_pretrained(REFERENCE, **precision_options("nf4", "cpu"))
    assert linears_4bit(pipe.backbone) == 42  # every linear layer but the output head
    assert torch.equal(greedy(pipe, "exact"), greedy(pipe, "ar"))


def test_nf4_keeps_out_the_layers_avx512_kernels_cannot_repack(cpu_kernels):
    """The reference model's MLP is 688 wide: those kernels need 4-bit layers a multiple of 32 wide, taking inputs a
    multiple of 64. Those layers stay in float32, and the warning says how much of the backbone that is."""
    cpu_kernels(True)
    with pytest.warns(UserWarning) as caught:
        pipe = SSDAutoregressivePipeline.from_pretrained(REFERENCE, **precision_options("nf4", "cpu"))
    assert str(caught[0].message) == (
        f"nf4 on this CPU keeps 18 of the 42 linear layers of the backbone of {REFERENCE} (67% of their weights) in "
        "the compute dtype: bitsandbytes' kernels for its AVX512-BF16 need a 4-bit layer's width to be a multiple of "
        "32 and its input's a multiple of 64 (model.layers.0.mlp.gate_proj: 256 -> 688 is not). int8 (torchao) "
        "quantizes them all on the CPU; a CUDA GPU runs them in 4 bits."
    )
    assert linears_4bit(pipe.backbone) == 24  # attention's 4 a layer
    assert pipe.backbone.model.layers[0].mlp.gate_proj.weight.dtype == torch.float32


def test_a_4bit_pipeline_these_kernels_cannot_run_is_refused_at_load(cpu_kernels, tmp_path):
    """Saved where every layer went to 4 bits (a GPU, or a CPU without AVX512-BF16), then loaded on such a CPU:
    refused at load rather than failing an assertion inside bitsandbytes at the first pass."""
    cpu_kernels(False)
    SSDAutoregressivePipeline.from_pretrained(REFERENCE, **precision_options("nf4", "cpu")).save_pretrained(tmp_path)
    cpu_kernels(True)
    with pytest.raises(ValueError) as refused:
        SSDAutoregressivePipeline.from_pretrained(tmp_path)
    assert str(refused.value) == (
        f"the backbone of {tmp_path} cannot run in 4 bits on this CPU: bitsandbytes' kernels for its AVX512-BF16 "
        "repack each 4-bit layer, which needs the layer's width to be a multiple of 32 and its input's a multiple "
        "of its block (64), and 18 layers are not (model.layers.0.mlp.gate_proj: 256 -> 688). Choose int8 (torchao) "
        "on the CPU, or run nf4 on a CUDA GPU."
    )


def test_auto_loads_every_component_in_the_dtype_the_backbone_is_stored_in(tmp_path):
    pipe = SSDAutoregressivePipeline.from_pretrained(REFERENCE, dtype="auto")
    assert pipe.backbone.dtype == pipe.heads.dtype == pipe.vqvae.dtype == torch.float16  # shipped in float16
    model, tokenizer = tiny_janus()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    assert SSDAutoregressivePipeline.from_pretrained(tmp_path, dtype="auto").backbone.dtype == torch.float32


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pipe")
    tiny_pipeline().save_pretrained(folder)
    return folder


@pytest.mark.parametrize(
    "options, error, message",
    [
        (
            {"bogus": 1},
            ValueError,
            (
                "from_pretrained takes no option 'bogus' for a pipeline folder: it takes heads, dtype, revision, "
                "cache_dir, local_files_only, token, force_download, device_map, max_memory, offload_folder, "
                "quantization_config, and backbone or tokenizer or vqvae to replace a component."
            ),
        ),
        (
            {"quantization_config": "int8"},
            TypeError,
            (
                "quantization_config must be diffusers' PipelineQuantizationConfig or a transformers quantization config "
                "for the backbone (e.g. PipelineQuantizationConfig(quant_mapping={'backbone': "
                "TorchAoConfig(Int8WeightOnlyConfig())}) or TorchAoConfig(Int8WeightOnlyConfig()) itself); got a str."
            ),
        ),
        (
            {"quantization_config": PipelineQuantizationConfig(quant_mapping={"backbone": INT8, "vqvae": INT8})},
            ValueError,
            (
                "quantization_config may quantize the backbone only, not vqvae: the heads and the VQ decoder are small "
                "beside it and stay in the pipeline's dtype (pass dtype= to change that)."
            ),
        ),
    ],
    ids=["unknown", "not-a-config", "vq-decoder"],
)
def test_options_it_would_not_use_are_refused(saved, options, error, message):
    """diffusers only warns of an unknown option, and ignores it (issue 41)."""
    with pytest.raises(error) as refused:
        SSDAutoregressivePipeline.from_pretrained(saved, **options)
    assert str(refused.value) == message


def test_a_checkpoint_names_what_it_takes(tmp_path):
    model, tokenizer = tiny_janus()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="takes no option 'tokenizer' for a transformers checkpoint: .* and vqvae"):
        SSDAutoregressivePipeline.from_pretrained(tmp_path, tokenizer=tokenizer)
