"""Word-level tokenizer over the fixed caption vocabulary of ``scenes.py``.

The reference world has a few dozen words, so one id per word is exact and
tiny; a WordLevel ``tokenizers`` model wrapped as ``PreTrainedTokenizerFast``
saves and loads like any Hub tokenizer, with no network and no training.
"""

from __future__ import annotations

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from .scenes import VOCABULARY

SPECIAL_TOKENS: tuple[str, ...] = ("<pad>", "<unk>", "<bos>", "<eos>")  # ids 0..3
# Longest caption ("a purple triangle left of an orange cross") is 8 words, plus <bos>/<eos>.
MAX_LENGTH = 16


def build_caption_tokenizer() -> PreTrainedTokenizerFast:
    """Lower-casing, whitespace+punctuation splitting, ``<bos> caption <eos>`` on encode."""
    vocab = {token: i for i, token in enumerate((*SPECIAL_TOKENS, *VOCABULARY))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A <eos>",
        special_tokens=[("<bos>", vocab["<bos>"]), ("<eos>", vocab["<eos>"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        model_max_length=MAX_LENGTH,
        padding_side="right",
    )
