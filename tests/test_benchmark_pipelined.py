"""`ssd-bench pipelined` runs end to end (a tiny random pipeline: the numbers mean nothing here)."""

from ssd_bench.pipelined import BLOCK_ROUNDS, PIPELINED_ROUNDS, main
from ssd_pipelines.testing import tiny_pipeline


def test_pipelined_benchmark_writes_its_table_and_figures(tmp_path, capsys):
    tiny_pipeline(rows=16, cols=16).save_pretrained(tmp_path / "model")  # 64 x 64 images, as the quality net reads
    out = tmp_path / "docs" / "ssd_pipelined.md"
    main(
        [
            *("--model", str(tmp_path / "model"), "--prompts", "2", "--images-per-prompt", "1", "--repeats", "1"),
            *("--windows", "17", "34", "--reference-renders", "32", "--out", str(out)),
        ]
    )
    text = out.read_text()
    assert text.endswith(capsys.readouterr().out)
    labels = [line.split(" | ")[0][2:] for line in text.splitlines() if line.startswith("| ")][1:]
    expected = ["ar", "exact", *(f"ssd r={r}" for r in BLOCK_ROUNDS)]
    expected += [f"ssd W={w} r={r}" for w in (17, 34) for r in PIPELINED_ROUNDS]
    assert labels == expected
    assert "\n| ar | 256.0 | 1.0x |" in text  # one pass per code
    for name in ("ssd_pipelined.png", "ssd_pipelined_images.png"):
        assert (out.parent / name).read_bytes()[:4] == b"\x89PNG"
