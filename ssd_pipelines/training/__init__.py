"""Training entry points (reference VQ tokenizer)."""
