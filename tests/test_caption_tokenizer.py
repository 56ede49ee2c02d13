"""Caption tokenizer: covers every caption, round-trips, stable special ids, saves like a Hub tokenizer."""

from transformers import AutoTokenizer

from ssd_pipelines.reference.caption_tokenizer import MAX_LENGTH, SPECIAL_TOKENS, build_caption_tokenizer
from ssd_pipelines.reference.scenes import VOCABULARY, make_dataset


def test_special_token_ids():
    tok = build_caption_tokenizer()
    assert tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == [0, 1, 2, 3]
    assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2, 3)
    assert len(tok) == len(SPECIAL_TOKENS) + len(VOCABULARY)


def test_every_caption_tokenises_without_unk_and_round_trips():
    tok = build_caption_tokenizer()
    captions = [s.caption for s in make_dataset(1000, seed=5)]
    for caption in captions:
        ids = tok(caption)["input_ids"]
        assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
        assert tok.unk_token_id not in ids
        assert len(ids) <= MAX_LENGTH
        assert " ".join(tok.decode(ids, skip_special_tokens=True).split()) == " ".join(caption.split())


def test_lower_cases_and_splits_punctuation():
    tok = build_caption_tokenizer()
    plain = tok("a red circle")["input_ids"]
    assert tok("A Red CIRCLE")["input_ids"] == plain
    # The full stop is split off as its own (unknown) token rather than glued onto "circle".
    assert tok("a red circle.")["input_ids"] == plain[:-1] + [tok.unk_token_id, tok.eos_token_id]
    assert tok("a hexagon")["input_ids"][2] == tok.unk_token_id


def test_padding_and_save_load(tmp_path):
    tok = build_caption_tokenizer()
    batch = tok(["a red circle", "four purple crosses"], padding="max_length", return_tensors="pt")
    assert batch["input_ids"].shape == (2, MAX_LENGTH)
    assert batch["input_ids"][0, 5:].eq(tok.pad_token_id).all()
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    caption = "a purple triangle left of an orange cross"
    assert loaded(caption)["input_ids"] == tok(caption)["input_ids"]
    assert loaded.pad_token_id == 0
