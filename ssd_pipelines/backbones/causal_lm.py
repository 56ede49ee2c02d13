"""KV-cached forward passes over a transformers decoder, shared by every adapter.

Janus-Pro, Emu3, Lumina-mGPT and our Llama reference model are all transformers
decoder stacks ending in a final RMSNorm. This class runs such a stack on input
embeddings with a KV cache that can be rewound (the rollback speculative
decoding needs) and is preallocated for the whole image (`kv_cache.py`),
handles left-padded prompt batches (positions and masks), and returns the
hidden states *before* the final norm, taken from the same pass.
"""

from __future__ import annotations

import threading

import torch
import transformers
from packaging.version import Version
from torch import nn

from .base import ImageBackbone, ImageGrid, KVState, PromptBatch
from .grouped_attention import fold_query_groups, restore_attention
from .kv_cache import PreallocatedCache, preallocated_cache, write_rows_at
from .prompts import left_padded_to_multiple, readable_chars
from .runner import EAGER, CompiledRunner, EagerRunner

_hook_lock = threading.Lock()
COMPILED = "_ssd_compiled_passes"  # where a decoder keeps its `CompiledRunner` (`CausalLMBackbone.compile_passes`)


def record_norm_input(_module: nn.Module, _args: tuple, kwargs: dict, output) -> None:
    """After the last decoder layer: its output, the final norm's input, onto the pass's cache if it is ours (other
    callers of the model pass theirs, or none, and are left alone). The cache is the call's own, so concurrent
    calls do not mix, and torch.compile traces this as part of the pass (a context variable broke its graph)."""
    cache = kwargs.get("cache")
    if isinstance(cache, PreallocatedCache):
        cache.norm_input = output[0] if isinstance(output, tuple) else output  # Chameleon's layers return tuples


def _install_capture_hook(last_layer: nn.Module) -> None:
    """Hook the last decoder layer once, for every adapter built on the decoder."""
    with _hook_lock:
        if not getattr(last_layer, "_ssd_capture_hooked", False):
            last_layer.register_forward_hook(record_norm_input, with_kwargs=True)
            last_layer._ssd_capture_hooked = True


# Under static passes a prompt batch is left-padded to a multiple of this many tokens, so that prompts of other
# lengths reuse the passes' graphs (dynamo would compile anew for each width, and give up after 8).
STATIC_PROMPT_MULTIPLE = 32

# The decoders take their KV cache as `cache=` from this version on; an older one swallows that keyword and
# runs every pass without the context, silently (seen on a GPU machine with 5.17: heads distilled from noise).
MIN_TRANSFORMERS = Version("5.24")


def check_transformers_version(installed: str = transformers.__version__) -> None:
    if Version(installed) < MIN_TRANSFORMERS:
        raise RuntimeError(
            f"ssd-pipelines needs transformers>={MIN_TRANSFORMERS} (its decoders take the KV cache as `cache=`), "
            f"found {installed}: pip install -U 'transformers>={MIN_TRANSFORMERS},<6'"
        )


def execution_device(module: nn.Module) -> torch.device:
    """The device a module computes on: its weights', or, when accelerate offloads them, its hook's."""
    hook = getattr(module, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(device)
    return next(module.parameters()).device


class CausalLMBackbone(ImageBackbone):
    """An `ImageBackbone` whose forward passes run a transformers decoder (`decoder.norm` is its final norm)."""

    def __init__(self, decoder: nn.Module):
        check_transformers_version()
        self.decoder = decoder
        self.final_norm: nn.Module = decoder.norm
        _install_capture_hook(decoder.layers[-1])

    @property
    def device(self) -> torch.device:
        """Where the last layer runs: under an accelerate device map, the final norm's execution device."""
        return execution_device(self.final_norm)

    @property
    def dtype(self) -> torch.dtype:
        return self.final_norm.weight.dtype

    @property
    def max_prompt_tokens(self) -> int:
        """A bound on the prompt tokens this model reads: what its tokenizer was made for and its positions (rotary
        positions extrapolate, so an adapter that cuts prompts says more precisely)."""
        return min(self.decoder.config.max_position_embeddings, self.tokenizer.model_max_length)

    @property
    def max_prompt_chars(self) -> int:
        """The longest prompt, in characters, that this model can read whole (`prompts.readable_chars`)."""
        return readable_chars(self.max_prompt_tokens, self.tokenizer)

    def _run(
        self, embeds: torch.Tensor, state: KVState, position_ids: torch.Tensor, attention_mask, eager: bool = False
    ) -> torch.Tensor:
        """One pass of the decoder, compiled unless `eager` where `compile_passes` asked; returns the input of its
        final norm."""
        inputs = {
            "inputs_embeds": embeds.to(self.dtype),
            "attention_mask": attention_mask,
            "position_ids": position_ids,
            "cache": state.cache,
            "use_cache": True,
        }
        runner = self.runner
        if runner is EAGER or eager:
            self.decoder(**inputs)
        else:  # a backend that fails runs it eagerly from then on, in the same shapes: the cache stays at its slots
            runner.forward(**inputs)
        hidden, state.cache.norm_input = state.cache.norm_input, None
        if runner.cuda_graphs and not eager:
            hidden = hidden.clone()  # set inside the graph: its next replay overwrites it (`compiled.py`)
        state.length += embeds.shape[1]
        return hidden.to(self.device)  # from the last layer's device to the final norm's, should a device map part them

    def compile_passes(self, options: dict | None) -> None:
        """Run the decoder's passes, and the engines' steps that ask (`runner.step`), through
        `torch.compile(fn, **options)`, or eagerly again with None.

        With dynamic=False the passes over the image take static shapes: each attends over every image slot of the
        cache (what a row has not written is masked), so one compiled graph serves every pass of a width, as CUDA
        graphs need (mode="reduce-overhead"); the prefill, whose width follows the prompts, then runs eagerly.

        Kept on the decoder module, which the pipeline's adapters share (an adapter is rebuilt on every access): a
        device or dtype it moves to fails the compiled code's guards, which compiles anew. Eager stays the
        reference; a function the backend cannot compile warns once and runs eagerly from then on
        (`compiled.CompiledFunction`)."""
        if options is None:
            self.decoder.__dict__.pop(COMPILED, None)
            restore_attention(self.decoder)
        else:
            self.decoder.__dict__[COMPILED] = CompiledRunner(self.decoder.forward, options)
            fold_query_groups(self.decoder)  # GQA attends over the cache unrepeated (`grouped_attention.py`)

    @property
    def runner(self) -> EagerRunner:
        return self.decoder.__dict__.get(COMPILED, EAGER)

    @torch.no_grad()
    def prefill(self, prompts: PromptBatch) -> tuple[KVState, torch.Tensor]:
        padded = prompts.padded
        ids, mask = prompts.input_ids, prompts.attention_mask
        if self.runner.static:  # the prompts' width sets the cache's and the masks' shapes: a few widths, few graphs
            ids, mask = left_padded_to_multiple(ids, mask, STATIC_PROMPT_MULTIPLE)
            padded = padded or ids.shape[1] > prompts.input_ids.shape[1]
        ids, mask = ids.to(self.device), mask.to(self.device)
        grid = prompts.grid or self.grid
        width = ids.shape[1]
        position_ids, image_offset = self.prompt_positions(prompts, mask)
        state = KVState(  # the cache holds at most the prompt and the whole image sequence
            cache=preallocated_cache(width + grid.sequence_length, self.runner.full),
            prompt_mask=mask if padded else None,
            image_offset=image_offset,
            prompt_width=width,
            length=0,
            image_slots=grid.sequence_length,
            grid=grid,
        )
        attention_mask = None
        if padded:
            causal = torch.ones(width, width, dtype=torch.bool, device=mask.device).tril()
            attention_mask = self._additive(causal & mask.bool()[:, None, :])  # [B', 1, P, P]
        hidden = self._run(self.embed_prompt(ids), state, position_ids, attention_mask, eager=self.runner.static)
        return state, hidden[:, -1]

    def prompt_positions(self, prompts: PromptBatch, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The position ids of the prompt tokens [B', P] (mask: the batch's, padded as the prefill runs it) and of each
        row's first image token [B', 1]. Left padding: each row's real tokens take positions 0..len-1; the padding is
        masked out, by a 4-D mask (transformers would read a 2-D one on the host)."""
        return (mask.cumsum(dim=1) - 1).clamp_min(0), mask.sum(dim=1, keepdim=True)

    def image_positions(self, state: KVState, positions: torch.Tensor) -> torch.Tensor:
        """Image positions [B', n] or [n] (0: the grid's first) -> the position ids the decoder takes."""
        return state.image_offset + positions

    def embed_prompt(self, ids: torch.Tensor) -> torch.Tensor:
        """Prompt token ids [B', P] -> input embeddings; adapters with separate text embeddings override it."""
        return self.decoder.embed_tokens(ids)

    @torch.no_grad()
    def extend(self, state: KVState, embeds: torch.Tensor) -> torch.Tensor:
        generated = state.length - state.prompt_width  # image tokens already in the cache
        n = embeds.shape[1]
        positions = torch.arange(generated, generated + n, device=embeds.device)  # [n]
        if self.runner.static:  # at their own slots, attending over all of them: the shapes of every such pass
            visible = torch.arange(state.image_slots, device=embeds.device) <= positions[:, None]  # [n, S]
            rows = embeds.shape[0]
            hidden = self.extend_at(state, embeds, positions.expand(rows, -1), visible.expand(rows, -1, -1))
            state.length = state.prompt_width + generated + n  # extend_at leaves it at the slots' end
            return hidden
        attention_mask = None
        if state.prompt_mask is not None:  # 4-D: transformers would read a 2-D padding mask on the host every pass
            visible = torch.arange(generated + n, device=embeds.device) <= positions[:, None]  # [n, T]: causal
            attention_mask = self._attention_mask(state, visible.expand(embeds.shape[0], -1, -1))
        return self._run(embeds, state, self.image_positions(state, positions), attention_mask)

    @torch.no_grad()
    def extend_rows(self, state: KVState, embeds: torch.Tensor, starts: torch.Tensor, length: int) -> torch.Tensor:
        positions = starts[:, None] + torch.arange(embeds.shape[1], device=embeds.device)  # [B', n]
        slots = torch.arange(state.image_slots if self.runner.static else length, device=embeds.device)
        # causal, and blind to uncommitted slots beyond: [B', n, T]
        return self.extend_at(state, embeds, positions, slots <= positions[..., None])

    @torch.no_grad()
    def extend_at(
        self,
        state: KVState,
        embeds: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        slots = positions if slots is None else slots
        width = visible.shape[-1]
        position_ids = self.image_positions(state, positions)
        write_rows_at(state.cache, state.prompt_width + slots, state.prompt_width + width)
        hidden = self._run(embeds, state, position_ids, self._attention_mask(state, visible))
        state.length = state.prompt_width + width
        return hidden

    def _attention_mask(self, state: KVState, visible: torch.Tensor) -> torch.Tensor:
        """The additive mask [B', 1, n, P + T] of tokens that see their row's prompt (less its padding) and the image
        slots visible [B', n, T] marks."""
        batch, n = visible.shape[:2]
        if state.prompt_mask is None:
            prompt = visible.new_ones(batch, n, state.prompt_width)
        else:
            prompt = state.prompt_mask.bool()[:, None, :].expand(-1, n, -1)
        return self._additive(torch.cat([prompt, visible], dim=-1))  # [B', 1, n, P + T]

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """Which keys each query may see [B', n, T] -> the additive mask the decoder takes [B', 1, n, T]."""
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=allowed.device)
        return mask.masked_fill_(~allowed, torch.finfo(self.dtype).min)[:, None]

    def memory_per_row(self, prompt_width: int, grid: ImageGrid) -> int:
        config = self.decoder.config
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        itemsize = self.dtype.itemsize
        cache = 2 * config.num_hidden_layers * kv_heads * head_dim * (prompt_width + grid.sequence_length) * itemsize
        # the prefill's hidden state in and out and its MLP's inner one, and its [P, P] mask
        prefill = prompt_width * (2 * config.hidden_size + config.intermediate_size) * itemsize
        return cache + prefill + prompt_width * prompt_width * itemsize

    def rewind(self, state: KVState, length: int) -> None:
        if length < state.prompt_width or length > state.length:
            raise ValueError(f"cannot rewind a cache of {state.length} tokens to {length}.")
        if length < state.length:
            state.cache.crop(length - state.length)  # transformers 5: a negative count of tokens to drop
            state.length = length
