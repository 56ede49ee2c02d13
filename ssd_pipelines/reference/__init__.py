"""Small reference text-to-image world: procedural scenes, a GenEval-style evaluator, caption tokenizer.

Import the submodules directly (``scenes``, ``evaluator``, ``caption_tokenizer``);
this package does not import them eagerly so that using the dataset does not
pull in ``transformers``.
"""
