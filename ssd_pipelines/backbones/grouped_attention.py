"""Grouped-query attention over the K/V cache as it is, for compiled passes (issue 51, point 5).

Our passes hand the decoder a 4-D additive mask, and with a mask transformers' `sdpa_attention_forward` declines
SDPA's own GQA (the fast CUDA kernels take no mask with it) and calls `repeat_kv`: every layer of every pass copies
the whole K/V cache out to all query heads (Emu3-Gen: 8 KV heads to 32, over some 8.2k slots at 720 px), the hot
path of static compiled passes. `grouped_sdpa_forward` instead folds each KV head's group of query heads into the
query length, so that one SDPA call reads the un-repeated cache. That is exact, each query attending on its own, but
need not be bit for bit eager's: `fold_query_groups` turns it on for a GQA decoder only while its passes are compiled,
and eager stays the reference.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface, PreTrainedModel
from transformers.integrations.sdpa_attention import sdpa_attention_forward, use_gqa_in_sdpa
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GROUPED_SDPA = "ssd_grouped_sdpa"
STOCK = "_ssd_stock_attention"  # where a decoder keeps the attention implementation `fold_query_groups` replaced


def folds(module, query, key, value, attention_mask, dropout: float, kwargs: dict) -> bool:
    """Whether `grouped_sdpa_forward` takes this call: grouped heads, a mask shared by the heads with a row a query,
    no dropout, nothing else for SDPA to add (a position bias, soft-capping, weights), and no GQA of SDPA's own."""
    if getattr(module, "num_key_value_groups", 1) == 1 or attention_mask is None or dropout:
        return False
    if attention_mask.dim() != 4 or attention_mask.shape[1] != 1 or attention_mask.shape[2] != query.shape[2]:
        return False
    if kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None or kwargs.get("output_attentions"):
        return False
    return not use_gqa_in_sdpa(attention_mask, key, value)


def grouped_sdpa_forward(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention over K/V [B, H_kv, T, d] unrepeated: the queries [B, H_kv * g, n, d] of each KV
    head's g heads as one row of g * n queries, the mask [B, 1, n, T] repeated g times to match. Any other call goes
    to transformers' own function."""
    if not folds(module, query, key, value, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    batch, heads, n, dim = query.shape
    groups = module.num_key_value_groups
    folded = query.reshape(batch, key.shape[1], groups * n, dim)  # head h is KV head h // g's, as in `repeat_kv`
    mask = attention_mask.repeat(1, 1, groups, 1)
    output = torch.nn.functional.scaled_dot_product_attention(folded, key, value, attn_mask=mask, scale=scaling)
    return output.reshape(output.shape[0], heads, n, value.shape[-1]).transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
AttentionMaskInterface.register(GROUPED_SDPA, sdpa_mask)  # the masks sdpa gets: only the attention differs


def fold_query_groups(decoder: PreTrainedModel) -> None:
    """Run a GQA decoder's sdpa attention through `grouped_sdpa_forward`, keeping what it ran on the decoder module
    (which the pipeline's adapters share, as its compiled passes); its sub-models (a VQ model) are left alone."""
    config = decoder.config
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if config._attn_implementation == "sdpa" and kv_heads < config.num_attention_heads:
        decoder.__dict__[STOCK] = config._attn_implementation
        decoder.set_attn_implementation({"": GROUPED_SDPA})


def restore_attention(decoder: PreTrainedModel) -> None:
    """Give the decoder back the attention `fold_query_groups` replaced, if it did."""
    stock = decoder.__dict__.pop(STOCK, None)
    if stock is not None:
        decoder.set_attn_implementation({"": stock})
