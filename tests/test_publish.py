"""The reference model's Hub folder: fp16 safetensors, a model card, loadable by the pipeline."""

import torch
from huggingface_hub import ModelCard

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.publishing.reference import REPO_ID, main
from ssd_pipelines.testing import tiny_pipeline


def test_publish_writes_a_loadable_fp16_pipeline_and_its_card(tmp_path, capsys):
    pipe = tiny_pipeline()
    pipe.backbone.save_pretrained(tmp_path / "run" / "backbone")
    pipe.tokenizer.save_pretrained(tmp_path / "run" / "tokenizer")
    pipe.vqvae.save_pretrained(tmp_path / "vqvae")
    pipe.heads.save_pretrained(tmp_path / "heads")
    (tmp_path / "bench.md").write_text("# title\n\n| decoding | adherence |\n|---|---|\n| ar | 0.5 |\n")
    out = tmp_path / "hub"
    main(
        [
            "--backbone",
            str(tmp_path / "run"),
            "--vqvae",
            str(tmp_path / "vqvae"),
            "--heads",
            str(tmp_path / "heads"),
            "--benchmark",
            str(tmp_path / "bench.md"),
            "--training",
            str(tmp_path / "none.md"),
            "--out",
            str(out),
        ]
    )
    assert '"bytes"' in capsys.readouterr().out
    card = ModelCard.load(out / "README.md")
    assert card.data.pipeline_tag == "text-to-image" and card.data.license == "apache-2.0"
    assert "| ar | 0.5 |" in card.text and "(not measured yet)" in card.text
    assert not list(out.rglob("*.bin"))
    loaded = SSDAutoregressivePipeline.from_pretrained(out, dtype=torch.float32)
    assert loaded.backbone.dtype == torch.float32 and loaded.heads.config.base_model == REPO_ID
    loaded.set_progress_bar_config(disable=True)
    assert loaded("a red circle", decoding="exact").images[0].size == (16, 16)


def test_new_heads_replace_the_published_ones_in_place(tmp_path, capsys):
    """--pipeline takes backbone, tokenizer and VQ model from the published folder itself; only the heads change."""
    pipe = tiny_pipeline()
    pipe.save_pretrained(tmp_path / "hub")
    new_heads = tiny_pipeline().heads
    torch.nn.init.normal_(new_heads.vertical[0].proj.weight)
    new_heads.save_pretrained(tmp_path / "heads")
    main(["--pipeline", str(tmp_path / "hub"), "--heads", str(tmp_path / "heads"), "--out", str(tmp_path / "hub")])
    loaded = SSDAutoregressivePipeline.from_pretrained(tmp_path / "hub")
    torch.testing.assert_close(loaded.heads.vertical[0].proj.weight, new_heads.vertical[0].proj.weight.half().float())
    torch.testing.assert_close(loaded.backbone.model.norm.weight, pipe.backbone.model.norm.weight.half().float())
    assert loaded.heads.config.base_model == REPO_ID


def test_the_card_alone_is_rebuilt_with_links_that_resolve_from_its_folder(tmp_path):
    tiny_pipeline().save_pretrained(tmp_path / "hub")
    weights = {f: f.read_bytes() for f in (tmp_path / "hub").rglob("*.safetensors")}
    (tmp_path / "docs" / "history").mkdir(parents=True)
    (tmp_path / "docs" / "history" / "diary.md").write_text("# diary\n")
    notes = tmp_path / "docs" / "training.md"
    notes.write_text("# title\n\nSee [the diary](history/diary.md#v4), [a site](https://x.org) and [here](#top).\n")
    main(
        [
            "--card-only",
            "--training",
            str(notes),
            "--benchmark",
            str(tmp_path / "no.md"),
            "--out",
            str(tmp_path / "hub"),
        ]
    )
    text = ModelCard.load(tmp_path / "hub" / "README.md").text
    assert "[the diary](../docs/history/diary.md#v4)" in text and "[a site](https://x.org)" in text
    assert "[here](#top)" in text and (tmp_path / "hub" / "../docs/history/diary.md").is_file()
    assert {f: f.read_bytes() for f in (tmp_path / "hub").rglob("*.safetensors")} == weights
