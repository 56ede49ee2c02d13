"""Weights that are not finite are refused, naming the safetensors file and the tensor as stored there.

A file whose data bytes are damaged but whose header is intact loads without an error; the end-to-end tests
scramble one tensor's bytes of the bundled reference pipeline and of tiny transformers checkpoints, and expect
the loaders to say which file and tensor.
"""

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from tiny_backbones import tiny_emu3, tiny_janus

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.finite_weights import check_finite
from ssd_pipelines.testing.host_syncs import count_host_syncs

REFERENCE = Path(__file__).resolve().parents[1] / "hub_cards" / "ssd-reference"
DAMAGED = (
    "holds NaN or infinite values. The file's data is damaged though its header reads: re-download it "
    "(force_download=True) or re-save the model with save_pretrained."
)


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 3)
        self.norm = torch.nn.LayerNorm(3)
        self.register_buffer("steps", torch.tensor([0, 5], dtype=torch.long))
        self.register_buffer("seen", torch.tensor([True, False]))


def saved(module: torch.nn.Module, folder: Path, **values: float) -> Path:
    """Save `module` as model.safetensors with one element of each tensor named in `values` (dots as "__") set to
    its value, and load it back: the module holds what the file holds."""
    state = {k: v.clone() for k, v in module.state_dict().items()}
    for key, value in values.items():
        state[key.replace("__", ".")].view(-1)[1] = value
    folder.mkdir(exist_ok=True)
    save_file(state, folder / "model.safetensors")
    module.load_state_dict(load_file(folder / "model.safetensors"))
    return folder / "model.safetensors"


def test_finite_weights_pass(tmp_path):
    module = Small()
    saved(module, tmp_path)
    assert check_finite(module, tmp_path, "test model") is None


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_tensor_not_finite_is_named_with_its_file(tmp_path, value):
    module = Small()
    file = saved(module, tmp_path, norm__bias=value)
    with pytest.raises(ValueError) as raised:
        check_finite(module, tmp_path, "test model")
    assert str(raised.value) == f"could not load the test model: tensor 'norm.bias' of {file} {DAMAGED}"


def test_the_others_are_counted_and_listed(tmp_path):
    module = Small()
    file = saved(module, tmp_path, proj__weight=float("nan"), proj__bias=float("inf"), norm__weight=float("nan"))
    with pytest.raises(ValueError) as raised:
        check_finite(module, tmp_path / "model.safetensors", "test model")
    damaged = DAMAGED.replace("values.", "values (and 2 more tensors: proj.bias, norm.weight).")
    assert str(raised.value) == f"could not load the test model: tensor 'proj.weight' of {file} {damaged}"


def test_integer_bool_and_meta_tensors_are_skipped(tmp_path):
    module = Small()
    saved(module, tmp_path)
    module.steps.fill_(torch.iinfo(torch.long).max)
    with torch.device("meta"):
        module.later = torch.nn.Linear(2, 2)  # not loaded yet: nothing to check
    check_finite(module, tmp_path, "test model")


def test_one_host_read_for_all_tensors(tmp_path):
    module = torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(50)))
    with count_host_syncs() as syncs:
        check_finite(module, tmp_path, "test model")
    assert syncs.counts == {"tolist": 1}, syncs.summary()


def test_a_sharded_index_names_the_shard(tmp_path):
    module = Small()
    state = module.state_dict()
    state["norm.bias"][0] = float("nan")
    shards = {"model-00001-of-00002.safetensors": ["proj.weight", "proj.bias"]}
    shards["model-00002-of-00002.safetensors"] = ["norm.weight", "norm.bias", "steps", "seen"]
    for shard, keys in shards.items():
        save_file({k: state[k] for k in keys}, tmp_path / shard)
    (tmp_path / "model.safetensors").write_bytes(b"")  # a stale file beside the shards is not theirs
    weight_map = {key: shard for shard, keys in shards.items() for key in keys}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    module.load_state_dict(state)
    with pytest.raises(ValueError) as raised:
        check_finite(module, tmp_path, "test model")
    shard = tmp_path / "model-00002-of-00002.safetensors"
    assert str(raised.value) == f"could not load the test model: tensor 'norm.bias' of {shard} {DAMAGED}"


class Tied(torch.nn.Module):
    """A head tied to an embedding and registered before it, so that `named_parameters()` calls the shared weight
    "head.weight" while the file holds it as "embed.weight"."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.embed = torch.nn.Embedding(5, 3)
        self.head.weight = self.embed.weight


def test_a_tied_weight_is_named_as_stored(tmp_path):
    module = Tied()
    weight = module.embed.weight.detach().clone()
    weight[2, 1] = float("nan")
    save_file({"embed.weight": weight}, tmp_path / "model.safetensors")
    module.embed.weight.data.copy_(weight)
    with pytest.raises(ValueError) as raised:
        check_finite(module, tmp_path, "test model")
    file = tmp_path / "model.safetensors"
    message = f"could not load the test model: tensor 'embed.weight' of {file} (loaded as 'head.weight') {DAMAGED}"
    assert str(raised.value) == message


def test_a_renamed_key_is_named_as_stored(tmp_path):
    """transformers loads Emu3's "text_model.model.x" as "model.text_model.x": of two damaged stored tensors of its
    shape, the one whose name ends as the loaded one's is named."""
    stored = {f"text_model.model.layers.{i}.weight": torch.full((2, 3), float("nan")) for i in range(2)}
    save_file(stored, tmp_path / "model.safetensors")
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.text_model = torch.nn.Module()
    model.model.text_model.layers = torch.nn.ModuleList(torch.nn.Linear(3, 2, bias=False) for _ in range(2))
    model.model.text_model.layers[1].weight.data.fill_(float("nan"))  # layer 0 is left finite
    with pytest.raises(ValueError) as raised:
        check_finite(model, tmp_path, "test model")
    file = tmp_path / "model.safetensors"
    message = (
        f"could not load the test model: tensor 'text_model.model.layers.1.weight' of {file} "
        f"(loaded as 'model.text_model.layers.1.weight') {DAMAGED}"
    )
    assert str(raised.value) == message


def test_values_that_overflow_the_loaded_dtype_ask_for_a_wider_one(tmp_path):
    module = Small()
    file = saved(module, tmp_path, proj__weight=1e6)
    module.half()
    with pytest.raises(ValueError) as raised:
        check_finite(module, tmp_path, "test model")
    assert str(raised.value) == (
        f"could not load the test model: tensor 'proj.weight' of {file} is finite there but overflows "
        "torch.float16: load the model in a wider dtype (dtype=torch.bfloat16 or torch.float32)."
    )


def test_a_tensor_no_file_holds_is_named_with_the_folder(tmp_path):
    module = Small()
    saved(module, tmp_path)
    module.register_buffer("scale", torch.tensor([1.0, float("nan")]), persistent=False)
    with pytest.raises(ValueError) as raised:
        check_finite(module, tmp_path, "test model")
    assert str(raised.value) == (
        f"could not load the test model: its tensor 'scale' holds NaN or infinite values, and no safetensors file "
        f"in {tmp_path} holds such values (it may be computed on loading). Re-download the weights "
        "(force_download=True) or re-save the model with save_pretrained."
    )


# End to end: the loaders of ssd_pipelines.hub run the check.


def scramble(file: Path, key: str) -> None:
    """Overwrite the data bytes of tensor `key` with 0xFF (NaN in every float format), keeping the header: 8 bytes
    of little-endian header length N, N bytes of JSON with each tensor's data_offsets from the data at 8 + N."""
    data = bytearray(file.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    begin, end = json.loads(data[8 : 8 + length])[key]["data_offsets"]
    data[8 + length + begin : 8 + length + end] = b"\xff" * (end - begin)
    file.write_bytes(bytes(data))


@pytest.fixture
def reference(tmp_path) -> Path:
    return Path(shutil.copytree(REFERENCE, tmp_path / "reference"))


@pytest.mark.parametrize(
    "component, file, key",
    [
        ("backbone", "model.safetensors", "model.layers.2.mlp.up_proj.weight"),
        ("heads", "diffusion_pytorch_model.safetensors", "horizontal.0.gate.weight"),
        ("vqvae", "diffusion_pytorch_model.safetensors", "decoder.conv_in.weight"),
    ],
)
def test_a_scrambled_component_of_a_pipeline_is_named(reference, component, file, key):
    scramble(reference / component / file, key)
    with pytest.raises(ValueError) as raised:
        SSDAutoregressivePipeline.from_pretrained(str(reference))
    where = reference / component / file
    assert str(raised.value) == f"could not load the {component} of {reference}: tensor '{key}' of {where} {DAMAGED}"


def test_scrambled_heads_loaded_into_a_pipeline_are_named(tmp_path):
    heads = Path(shutil.copytree(REFERENCE / "heads", tmp_path / "heads"))
    file = heads / "diffusion_pytorch_model.safetensors"
    scramble(file, "vertical.0.up.weight")
    pipe = SSDAutoregressivePipeline.from_pretrained(str(REFERENCE))
    with pytest.raises(ValueError) as raised:
        pipe.load_heads(heads)
    message = f"could not load the drafting heads in {heads}: tensor 'vertical.0.up.weight' of {file}"
    assert str(raised.value) == f"{message} {DAMAGED}"


@pytest.mark.parametrize(
    "make, stored, loaded",
    [
        (tiny_janus, "model.language_model.layers.1.mlp.up_proj.weight", None),
        (tiny_emu3, "text_model.model.layers.1.mlp.up_proj.weight", "model.text_model.layers.1.mlp.up_proj.weight"),
    ],
)
def test_a_scrambled_transformers_checkpoint_is_named(tmp_path, make, stored, loaded):
    model, tokenizer = make()
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    file = tmp_path / "model.safetensors"
    scramble(file, stored)
    with pytest.raises(ValueError) as raised:
        SSDAutoregressivePipeline.from_pretrained(str(tmp_path))
    loaded_as = f" (loaded as '{loaded}')" if loaded else ""
    assert (
        str(raised.value)
        == f"could not load the backbone of {tmp_path}: tensor '{stored}' of {file}{loaded_as} {DAMAGED}"
    )


class Quantized(torch.Tensor):
    """A weight as a quantization backend holds it (torchao's Int8Tensor): a tensor subclass that answers only the
    operators its backend implements, not `aminmax`."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.aminmax:
            raise NotImplementedError("Quantized: aminmax is not implemented")
        return super().__torch_function__(func, types, args, kwargs or {})


def test_quantized_weights_are_left_to_their_backend(tmp_path):
    """from_pretrained(..., quantization_config=...) loads the backbone's linear weights so (issue 41)."""
    module = Small()
    saved(module, tmp_path)
    module.proj.weight = torch.nn.Parameter(module.proj.weight.detach().as_subclass(Quantized), requires_grad=False)
    check_finite(module, tmp_path, "test model")
