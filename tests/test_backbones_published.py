"""What every published backbone must do through the library, on tiny random instances of its real class:
exact decoding, SSD images through its real VQ decoder, head distillation, loading from a saved checkpoint or
a heads repository, offline errors, and a device map that splits the model."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from accelerate import Accelerator
from huggingface_hub import snapshot_download
from tiny_backbones import VQGANShape, tiny_emu3, tiny_janus, tiny_lumina, write_chameleon_tokenizer

from ssd_pipelines import ARDecoding, DraftHeads, ExactDecoding, SamplingConfig, SSDAutoregressivePipeline
from ssd_pipelines.backbones import Emu3Backbone, JanusProBackbone, LuminaMGPTBackbone
from ssd_pipelines.backbones.chameleon_vqgan import load_chameleon_vqgan
from ssd_pipelines.training.distill_data import collect
from ssd_pipelines.training.head_training import train_heads

PROMPTS = ["a red dog", "the blue cat in the rain"]


@dataclass
class Published:
    """One backbone's tiny instance: its adapter at a tiny size, its pipeline, its saved checkpoint."""

    name: str
    model: torch.nn.Module
    tokenizer: object
    size: dict  # height / width for pipeline calls
    layers: str  # the decoder stack, split by the device-map test
    vqvae: object = None  # Lumina-mGPT: the converted Chameleon VQGAN

    def adapter(self):
        if self.name == "janus":
            return JanusProBackbone(self.model, self.tokenizer)
        size = (self.size["height"], self.size["width"])
        if self.name == "emu3":
            return Emu3Backbone(self.model, self.tokenizer, image_size=size)
        return LuminaMGPTBackbone(self.model, self.tokenizer, self.vqvae, image_size=size)

    def heads(self, base_model: str, seed: int = 1, drafter: str = "cell") -> DraftHeads:
        torch.manual_seed(seed)
        adapter = self.adapter()
        return DraftHeads(
            hidden_size=adapter.hidden_size,
            embed_size=adapter.embed_size,
            codebook_size=adapter.grid.codebook_size,
            horizontal_offsets=(1, 2, 3),
            vertical_offsets=(1, 2) if drafter == "cell" else (1,),
            base_model=base_model,
            vertical_drafter=drafter,
        ).eval()

    def pipeline(self, heads: DraftHeads | None = None) -> SSDAutoregressivePipeline:
        pipe = SSDAutoregressivePipeline(self.model, self.tokenizer, self.vqvae, heads)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    @property
    def load_options(self) -> dict:
        return {} if self.vqvae is None else {"vqvae": self.vqvae}

    def save_checkpoint(self, folder: Path) -> Path:
        """The model as its Hub repository holds it: transformers' save_pretrained and the tokenizer."""
        self.model.save_pretrained(folder)
        self.tokenizer.save_pretrained(folder)
        return folder


@pytest.fixture(scope="module", params=["janus", "emu3", "lumina"])
def published(request, tmp_path_factory) -> Published:
    if request.param == "janus":
        return Published("janus", *tiny_janus(), {}, "model.language_model")
    if request.param == "emu3":
        return Published("emu3", *tiny_emu3(), {"height": 6, "width": 8}, "model.text_model")
    folder = tmp_path_factory.mktemp("chameleon-tokenizer")
    write_chameleon_tokenizer(folder, VQGANShape(levels=5, resolution=64, attention=False))  # 16 px codes
    vqvae = load_chameleon_vqgan(folder)
    return Published("lumina", *tiny_lumina(), {"height": 64, "width": 96}, "model", vqvae)


def run(pipe: SSDAutoregressivePipeline, published: Published, **kwargs):
    options = {"generator": torch.Generator().manual_seed(0), "output_type": "latent", **published.size, **kwargs}
    return pipe(PROMPTS, **options)


def test_exact_greedy_is_ar_greedy(published):
    adapter = published.adapter()
    sampling = SamplingConfig(temperature=0, guidance_scale=3.0)
    batch = adapter.encode_prompts(PROMPTS, num_images_per_prompt=2, guidance=True)
    ar = ARDecoding().decode(adapter, batch, sampling)
    exact = ExactDecoding(published.heads("tests")).decode(adapter, batch, sampling)
    assert torch.equal(exact.codes, ar.codes)
    assert exact.stats.drafted_per_round[0] > 0  # it drafted and verified blocks, not one cell a pass


def test_ssd_with_random_heads_draws_images_through_the_real_vq_decoder(published):
    pipe = published.pipeline(published.heads("tests"))
    out = run(pipe, published, decoding="ssd", verify_rounds=1, num_images_per_prompt=2, output_type="pt")
    height, width = published.size.get("height", 8), published.size.get("width", 8)
    grid = published.adapter().grid
    assert out.images.shape == (4, 3, height, width) and out.codes.shape == (4, grid.rows, grid.cols)
    assert 0 <= float(out.images.min()) and float(out.images.max()) <= 1 and float(out.images.std()) > 0
    torch.testing.assert_close(out.images, pipe.decode_codes(out.codes, output_type="pt"))


@pytest.mark.parametrize("drafter, loss", [("cell", "smooth_l1"), ("inrow", "kl"), ("recurrent", "kl")])
def test_head_distillation_lowers_the_loss(published, drafter, loss):
    """The paper's head on its loss, and the in-row drafters on the verifier's distribution (the backbone's own
    output head: Janus-Pro's generation head, Emu3's and Lumina-mGPT's code logits)."""
    adapter = published.adapter()
    sampling = SamplingConfig(guidance_scale=2.0)
    data = collect(adapter, PROMPTS, sampling, images_per_prompt=4, seed=0)
    grid = adapter.grid
    assert data.hidden.shape == (8, 2, grid.rows, grid.cols, adapter.hidden_size)
    heads = published.heads("tests", seed=2, drafter=drafter)
    log = train_heads(heads, adapter, data, 20, 1e-2, 8, Accelerator(cpu=True), loss=loss, sampling=sampling)
    assert log["loss"][-1][1] < 0.8 * log["loss"][0][1]
    if drafter != "cell":
        out = run(published.pipeline(heads), published, decoding="ssd", vertical_rows=1)
        assert out.codes.shape[1:] == (grid.rows, grid.cols) and out.stats["acceptance_per_round"]


def test_from_pretrained_on_the_saved_checkpoint_and_pipeline(published, tmp_path):
    heads = published.heads("tests")
    expected = run(published.pipeline(heads), published, decoding="ssd").codes
    checkpoint = published.save_checkpoint(tmp_path / "checkpoint")
    pipe = SSDAutoregressivePipeline.from_pretrained(checkpoint, heads=heads, **published.load_options)
    assert torch.equal(run(pipe, published, decoding="ssd").codes, expected)
    pipe.set_progress_bar_config(disable=False)
    pipe.save_pretrained(tmp_path / "pipeline")
    again = SSDAutoregressivePipeline.from_pretrained(tmp_path / "pipeline")
    again.set_progress_bar_config(disable=True)
    assert torch.equal(run(again, published, decoding="ssd").codes, expected)
    half = SSDAutoregressivePipeline.from_pretrained(checkpoint, dtype=torch.bfloat16, **published.load_options)
    half.set_progress_bar_config(disable=True)
    assert run(half, published, decoding="ar", output_type="pt").images.shape[0] == len(PROMPTS)


def test_a_heads_repository_pulls_its_base_checkpoint(published, hub, tmp_path):
    base = f"org/tiny-{published.name}"
    hub.add_repo(base, published.save_checkpoint(tmp_path / "checkpoint"))
    hub.add_repo(base, {**hub.files(base), "pytorch_model.bin": b"pickle: never fetched"})
    heads = published.heads(base)
    heads.push_to_hub(f"{base}-heads", token="hf_writer")
    pipe = SSDAutoregressivePipeline.from_pretrained(f"{base}-heads", **published.load_options)
    pipe.set_progress_bar_config(disable=True)
    assert "pytorch_model.bin" not in hub.downloaded(base) and "model.safetensors" in hub.downloaded(base)
    assert pipe.config._name_or_path == base and pipe.heads.config.base_model == base
    expected = run(published.pipeline(heads), published, decoding="ssd").codes
    assert torch.equal(run(pipe, published, decoding="ssd").codes, expected)


def test_an_absent_base_checkpoint_offline_is_named_with_how_to_get_it(published, hub):
    base = f"org/tiny-{published.name}"
    published.heads(base).push_to_hub(f"{base}-heads", token="hf_writer")
    snapshot_download(f"{base}-heads")  # the heads are cached; their base never was
    with pytest.raises(ValueError, match=f"'{base}' is no local folder.*`hf download {base}`"):
        SSDAutoregressivePipeline.from_pretrained(f"{base}-heads", local_files_only=True)


def split_device_map(model: torch.nn.Module, offloaded: set[str]) -> dict[str, str]:
    """Every module on "cpu" except `offloaded`, which accelerate keeps on disk and loads at each call."""
    device_map = {}

    def visit(prefix: str, module: torch.nn.Module) -> None:
        for name, child in module.named_children():
            path = prefix + name
            if path in offloaded:
                device_map[path] = "disk"
            elif any(o.startswith(path + ".") for o in offloaded):
                visit(path + ".", child)
            else:
                device_map[path] = "cpu"

    visit("", model)
    return device_map


def test_a_device_map_splitting_the_model_gives_the_unsplit_codes(published, tmp_path):
    checkpoint = published.save_checkpoint(tmp_path / "checkpoint")
    heads = published.heads("tests")
    last = len(published.model.get_submodule(f"{published.layers}.layers")) - 1
    device_map = split_device_map(published.model, {f"{published.layers}.layers.{last}", f"{published.layers}.norm"})
    pipe = SSDAutoregressivePipeline.from_pretrained(
        checkpoint, heads=heads, device_map=device_map, offload_folder=tmp_path / "offload", **published.load_options
    )
    pipe.set_progress_bar_config(disable=True)
    backbone = pipe.image_backbone
    assert backbone.final_norm.weight.device.type == "meta"  # offloaded: loaded by accelerate at each call
    assert pipe.heads.device == backbone.device == torch.device("cpu")  # beside the last layer
    unsplit = published.pipeline(heads)
    for decoding in ("ar", "ssd"):
        assert torch.equal(
            run(pipe, published, decoding=decoding).codes, run(unsplit, published, decoding=decoding).codes
        )
