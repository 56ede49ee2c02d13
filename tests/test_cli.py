import json
import os
import re
import tempfile
from pathlib import Path

import PIL.Image
import pytest
import torch

from ssd_pipelines.cli import main
from ssd_pipelines.seeds import MAX_SEED
from ssd_pipelines.testing import tiny_pipeline


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-pipeline")
    tiny_pipeline().save_pretrained(folder)
    return folder


def test_generate_writes_the_image_and_prints_statistics(model_dir, tmp_path, capsys):
    out = tmp_path / "img.png"
    args = ["a red circle", "--out", str(out), "--model", str(model_dir)]
    assert main([*args, "--decoding", "ssd", "--rounds", "1"]) == 0
    assert PIL.Image.open(out).size == (16, 16)
    printed = capsys.readouterr().out
    assert "ssd: 8 forward passes" in printed and "acceptance per round" in printed and str(out) in printed


def test_the_default_is_lossless_and_says_what_it_chose(model_dir, tmp_path, capsys):
    """`auto`: one image is decoded with `exact`, and the line says so."""
    out = tmp_path / "img.png"
    assert main(["a red circle", "--out", str(out), "--model", str(model_dir)]) == 0
    assert re.match(r"auto \(exact\): \d+ forward passes", capsys.readouterr().out)


def test_json_and_compare_save_both_images_and_the_speedup(model_dir, tmp_path, capsys):
    out = tmp_path / "img.png"
    main(
        [
            "a red circle",
            "--out",
            str(out),
            "--model",
            str(model_dir),
            "--json",
            "--compare",
            "--num-images",
            "2",
            "--seed",
            "3",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["decoding"]["strategy"] == "auto" and report["ar"]["strategy"] == "ar"
    assert report["decoding"]["chosen_decoding"] == "ar"  # two images: past auto's crossover (1 image)
    assert report["files"] == [str(tmp_path / "img-0.png"), str(tmp_path / "img-1.png")]
    assert report["ar"]["files"] == [str(tmp_path / "img-ar-0.png"), str(tmp_path / "img-ar-1.png")]
    assert all(PIL.Image.open(f).size == (16, 16) for f in report["files"] + report["ar"]["files"])
    passes = report["ar"]["forward_passes"] / report["decoding"]["forward_passes"]
    assert report["speedup"]["forward_passes"] == pytest.approx(passes)


def test_grid_puts_every_decodings_images_on_one_sheet(model_dir, tmp_path, capsys):
    """A row per decoding (130 px of label, then 32 px tiles and 4 px gaps), a column per image."""
    sheet, out = tmp_path / "sheets" / "grid.png", str(tmp_path / "img.png")
    args = ["a red circle", "--out", out, "--model", str(model_dir), "--num-images", "3", "--compare", "--json"]
    main([*args, "--grid", str(sheet)])
    report = json.loads(capsys.readouterr().out)
    assert report["grid"] == str(sheet)
    grid = PIL.Image.open(sheet).convert("RGB")
    assert grid.size == (130 + 3 * (32 + 4), 66 + 2 * (32 + 4))
    first_ar = PIL.Image.open(report["ar"]["files"][0]).convert("RGB").resize((32, 32), PIL.Image.NEAREST)
    assert grid.crop((130, 66 + 36, 130 + 32, 66 + 36 + 32)).tobytes() == first_ar.tobytes()  # row 2: ar
    with pytest.raises(SystemExit):  # the sheet exists now: refused like any image file
        main(["a", "--out", str(tmp_path / "new.png"), "--model", str(model_dir), "--grid", str(sheet)])
    assert f"{sheet} already exists: pass --overwrite" in capsys.readouterr().err


def test_exact_decoding_from_the_command_line(model_dir, tmp_path, capsys):
    main(["a", "--out", str(tmp_path / "x.png"), "--model", str(model_dir), "--decoding", "exact", "--json"])
    assert json.loads(capsys.readouterr().out)["decoding"]["strategy"] == "exact"


def test_auto_and_its_crossover_from_the_command_line(model_dir, tmp_path, capsys):
    """The flag comes from the option's declaration; the statistics say which decoding auto chose."""
    base = ["a", "--model", str(model_dir), "--decoding", "auto", "--num-images", "2", "--json"]
    for crossover, chosen in (("2", "exact"), ("1", "ar")):
        main([*base, "--out", str(tmp_path / f"x{crossover}.png"), "--exact-max-batch", crossover])
        stats = json.loads(capsys.readouterr().out)["decoding"]
        assert stats["strategy"] == "auto" and stats["chosen_decoding"] == chosen
    with pytest.raises(SystemExit):
        main(
            [
                "a",
                "--out",
                str(tmp_path / "y.png"),
                "--model",
                str(model_dir),
                "--decoding",
                "ssd",
                "--exact-max-batch",
                "2",
            ]
        )
    assert "--exact-max-batch: exact_max_batch applies to decoding='auto' only, not 'ssd'" in capsys.readouterr().err


def test_compare_needs_a_speculative_decoding(model_dir, tmp_path):
    with pytest.raises(SystemExit):
        main(["a", "--out", str(tmp_path / "x.png"), "--model", str(model_dir), "--decoding", "ar", "--compare"])


def test_existing_files_are_not_overwritten_unless_asked(model_dir, tmp_path, capsys):
    out = tmp_path / "img.png"
    (tmp_path / "img-ar.png").write_bytes(b"keep me")
    args = ["a", "--out", str(out), "--model", str(model_dir), "--compare"]
    with pytest.raises(SystemExit):
        main(args)
    assert "img-ar.png already exists: pass --overwrite" in capsys.readouterr().err
    assert (tmp_path / "img-ar.png").read_bytes() == b"keep me" and not out.exists()
    assert main([*args, "--overwrite"]) == 0
    assert PIL.Image.open(tmp_path / "img-ar.png").size == (16, 16)


@pytest.mark.parametrize("name", ["img.xyz", "img"])
def test_an_image_type_pil_cannot_write_is_refused_before_generating(tmp_path, capsys, name):
    with pytest.raises(SystemExit):
        main(["a", "--out", str(tmp_path / name), "--model", "never-loaded"])
    assert "cannot write" in capsys.readouterr().err


def test_rounds_for_a_decoding_without_them_is_refused(model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["a", "--out", str(tmp_path / "x.png"), "--model", str(model_dir), "--decoding", "exact", "--rounds", "1"])
    assert "--rounds: verify_rounds applies to decoding='ssd' only, not 'exact'" in capsys.readouterr().err


def test_a_fractional_or_negative_option_is_refused_in_the_librarys_words(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["a", "--out", str(tmp_path / "x.png"), "--model", "never-loaded", "--decoding", "ssd", "--rounds", "-1"])
    assert "--rounds: `verify_rounds` must be an integer >= 0 for decoding='ssd'" in capsys.readouterr().err


def test_an_out_path_under_a_file_is_refused_before_loading(tmp_path, capsys):
    (tmp_path / "afile").write_text("not a folder")
    with pytest.raises(SystemExit):
        main(["a", "--out", str(tmp_path / "afile" / "x.png"), "--model", "never-loaded"])
    err = capsys.readouterr().err
    assert f"cannot write {tmp_path / 'afile' / 'x.png'}: {tmp_path / 'afile'} is a file, not a folder" in err
    assert "Traceback" not in err


@pytest.fixture
def unwritable(tmp_path):
    """A folder no file can be created in: a read-only one; for root, whom permissions do not stop, /sys."""
    folder = tmp_path / "read-only"
    folder.mkdir(mode=0o500)
    if os.geteuid() == 0:
        folder = Path("/sys")
    try:
        with tempfile.NamedTemporaryFile(dir=folder):
            pytest.skip(f"{folder} takes new files here")
    except OSError:
        pass
    yield folder
    (tmp_path / "read-only").chmod(0o700)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--out", "{folder}/x.png"], "--out {folder}/x.png: cannot write files in {folder} ("),
        (
            ["--out", "{folder}/new/x.png"],
            "--out {folder}/new/x.png: cannot create the folder {folder}/new in {folder} (",
        ),
        (
            ["--out", "{tmp}/x.png", "--grid", "{folder}/g.png"],
            "--grid {folder}/g.png: cannot write files in {folder} (",
        ),
    ],
)
def test_an_output_folder_that_cannot_be_written_is_refused_before_loading(tmp_path, capsys, unwritable, argv, says):
    """Not after decoding, in PIL, with the images lost; --model is never loaded."""
    with pytest.raises(SystemExit):
        main(["a", *(arg.format(folder=unwritable, tmp=tmp_path) for arg in argv), "--model", "never-loaded"])
    err = capsys.readouterr().err
    assert says.format(folder=unwritable) in err and "choose a folder you can write to" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("device", "says"), [("bogus", "not a torch device"), ("cuda:99", "there is no cuda:99 device here")]
)
def test_a_device_this_machine_lacks_is_refused_before_loading(tmp_path, capsys, device, says):
    with pytest.raises(SystemExit):
        main(["a", "--out", str(tmp_path / "x.png"), "--model", "never-loaded", "--device", device])
    err = capsys.readouterr().err
    assert f"--device {device}: {says}; this machine has cpu" in err and "pass one of those" in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_names_the_devices_there_are(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["a", "--out", str(tmp_path / "x.png"), "--model", "never-loaded", "--device", "cuda"])
    assert "--device cuda: there is no cuda device here; this machine has cpu: pass one of those" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_a_seed_out_of_range_is_refused_in_the_rule_of_every_face(tmp_path, capsys, seed):
    """seeds.py's rule, as the server and the bulk job apply it: not torch's "Overflow when unpacking long long"."""
    with pytest.raises(SystemExit):
        main(["a", "--out", str(tmp_path / "x.png"), "--model", "never-loaded", "--seed", seed, "--num-images", "2"])
    assert f"--seed must be a whole number from 0 to {MAX_SEED}, got {seed}." in capsys.readouterr().err


def test_the_largest_seed_serves_a_batch(tmp_path, capsys):
    """The CLI's images all draw from one generator seeded --seed (unlike the server's seed + j): the largest seed
    passes with any --num-images, and the call goes on to load the model."""
    args = ["a", "--out", str(tmp_path / "x.png"), "--model", "never-loaded", "--seed", str(MAX_SEED)]
    assert main([*args, "--num-images", "2"]) != 0
    err = capsys.readouterr().err
    assert "--seed" not in err and "'never-loaded' is no local folder" in err


def test_guidance_threads_and_prompt_warnings(model_dir, tmp_path, capsys, monkeypatch):
    """Without --guidance the model's own scale is used; a cut prompt is said once, on stderr and in the JSON."""
    threads = []
    monkeypatch.setattr("torch.set_num_threads", threads.append)
    long_prompt = " ".join(["red"] * 300)  # cut to the tokens the model reads, within the characters it may span
    main([long_prompt, "--out", str(tmp_path / "x.png"), "--model", str(model_dir), "--json", "--threads", "2"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    from ssd_pipelines import SSDAutoregressivePipeline

    assert (
        report["guidance_scale"]
        == SSDAutoregressivePipeline.from_pretrained(model_dir).image_backbone.default_guidance_scale
    )
    assert threads == [2]
    assert len(report["decoding"]["warnings"]) == 1 and "this model reads at most" in report["decoding"]["warnings"][0]
    assert captured.err.count("ssd-generate: warning: the prompt") == 1


def test_a_pipeline_error_is_one_line_not_a_traceback(model_dir, tmp_path, capsys):
    args = ["a", "--out", str(tmp_path / "x.png"), "--model", str(model_dir)]
    code = main([*args, "--decoding", "ssd", "--vertical-rows", "3"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.endswith("ssd-generate: error: vertical_rows must be in 1..2 (the heads' vertical offsets), got 3.\n")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "flags, grid",
    [
        (["--out", "g.png"], "g.png"),
        (["--out", "g.png", "--compare"], "g-ar.png"),
        (["--out", "g.png", "--num-images", "3"], "g-2.png"),
        (["--out", "g.png", "--num-images", "3", "--compare"], "g-ar-0.png"),
    ],
)
def test_a_grid_that_would_overwrite_an_image_is_refused(tmp_path, capsys, flags, grid):
    """Issue 56: `--out g.png --grid g.png` wrote the sheet over the image, and `--grid g-ar.png` over AR's."""
    flags = [str(tmp_path / f) if f.endswith(".png") else f for f in flags]
    with pytest.raises(SystemExit):
        main(["a red circle", *flags, "--grid", str(tmp_path / grid)])
    assert capsys.readouterr().err.endswith(
        f"error: --grid {tmp_path / grid} is also the name of an image file of --out {tmp_path / 'g.png'}: "
        "choose another --grid\n"
    )


@pytest.mark.parametrize("grid", ["g-3.png", "g-01.png", "g-ar.png", "h.png"])
def test_a_grid_beside_the_images_is_not_taken_for_one(grid, tmp_path):
    from ssd_pipelines.cli import parse_args

    args = parse_args(
        ["a red circle", "--out", str(tmp_path / "g.png"), "--num-images", "3", "--grid", str(tmp_path / grid)]
    )
    assert args.grid == tmp_path / grid


def test_millions_of_images_are_refused_without_naming_each_file(model_dir, tmp_path, capsys, monkeypatch):
    """Issue 56: --num-images 10000000 spent 117 s and 2.8 GB on output names before the memory check said no."""
    from ssd_pipelines import cli

    named = []
    monkeypatch.setattr(cli, "output_paths", lambda out, count, tag="": named.append(count) or [])
    (tmp_path / "img-5.png").write_bytes(b"")  # one of the ten million names, found without making them all
    args = ["a red circle", "--out", str(tmp_path / "img.png"), "--model", str(model_dir), "--num-images", "10000000"]
    with pytest.raises(SystemExit):
        main(args)
    assert f"{tmp_path / 'img-5.png'} already exists: pass --overwrite to replace it," in capsys.readouterr().err
    (tmp_path / "img-7.png").write_bytes(b"")
    with pytest.raises(SystemExit):
        main(args)
    taken = f"{tmp_path / 'img-5.png'}, {tmp_path / 'img-7.png'} already exist: pass --overwrite to replace them,"
    assert taken in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 2
    assert "10000000 images need at least" in capsys.readouterr().err
    assert named == []


def test_compare_says_how_many_times_faster_or_slower(model_dir, tmp_path, capsys):
    """Issue 56: "2.5x fewer forward passes, 0.9x less time" read like a speedup while it was a slowdown."""
    main(["a red circle", "--out", str(tmp_path / "img.png"), "--model", str(model_dir), "--compare"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"auto \(exact\): [\d.]+x (fewer|more) forward passes and ([\d.]+x (faster|slower) than|as fast as) ar", last
    ), last
