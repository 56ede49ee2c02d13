"""Bulk generation on Ray Data (ssd_pipelines/serving/bulk.py): resumable, nothing redone, seeds by prompt index.

The bookkeeping tests run without Ray. The job itself runs in a subprocess that joins the session's Ray
(tests/ray_cluster.py), is killed once some images are written, and is run again to the end.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import PIL.Image
import pytest
import torch

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.hub import BUNDLED_MODEL
from ssd_pipelines.seeds import MAX_SEED
from ssd_pipelines.serving import bulk
from ssd_pipelines.serving.bulk_store import BulkOutput

REPO = Path(__file__).resolve().parents[1]
RUN_S = 240
PROMPTS = [
    "a red circle",
    "two blue squares",
    "",  # a blank line draws nothing, and the lines after it keep their numbers
    "a yellow cross",
    "three green triangles",
    "a blue ring left of a red square",
    "a green circle",
    "two yellow triangles",
    "a red cross above a blue circle",
    "a purple square",
    "a green ring",
    "three red circles",
    "a blue triangle",
]


def test_finished_prompts_survive_a_record_cut_short_and_a_changed_file_is_refused(tmp_path):
    output = BulkOutput(tmp_path)
    output.claim({"decoding": "ssd", "seed": 0})
    with open(output.stats_path, "a") as log:
        output.write(log, 0, b"png-0", {"index": 0, "prompt": "a red circle"})
        output.write(log, 1, b"", {"index": 1, "prompt": "blue", "error": "ValueError: no"})
        log.write('{"index": 2, "prompt": "gre')  # killed while writing
    assert output.finished({0: "a red circle", 1: "blue", 2: "green"}) == {0}  # the error is drawn again
    assert output.stats_path.read_text().endswith("}\n")  # the torn line is gone: the next append starts clean
    with pytest.raises(ValueError, match="the prompts file changed"):
        output.finished({0: "a blue circle"})
    with pytest.raises(ValueError, match=r"other settings \(seed: 0 then, 1 now\)"):
        BulkOutput(tmp_path).claim({"decoding": "ssd", "seed": 1})


def test_bad_options_are_refused_before_anything_starts(tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    for argv, says in [
        (["--decoding", "ar", "--verify-rounds", "1"], "verify_rounds applies to"),
        (["--temperature", "-1"], "temperature must be >= 0"),
        (["--batch-size", "0"], "--batch-size must be >= 1"),
    ]:
        with pytest.raises(SystemExit):
            bulk.parse_args([str(prompts), "--out", str(tmp_path / "out"), *argv])
        assert says in capsys.readouterr().err


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"a red circle\n\x89PNG\r\n", "is not UTF-8 text (byte 0x89 at position 13): give a text file of prompts"),
        (b"a red circle\n\x00\x00", "holds NUL bytes at position 13, as binary files do: give a text file of prompts"),
    ],
    ids=["not-utf8", "nul-bytes"],
)
def test_a_binary_prompts_file_is_refused_by_name(tmp_path, capsys, data, says):
    """Issue 56, case 11: the error said only "'utf-8' codec can't decode byte 0x89", of no file."""
    prompts = tmp_path / "prompts.bin"
    prompts.write_bytes(data)
    with pytest.raises(SystemExit):
        bulk.parse_args([str(prompts), "--out", str(tmp_path / "out")])
    assert f"error: {prompts} {says}" in capsys.readouterr().err


def test_an_out_that_cannot_be_made_is_refused_before_ray_starts(tmp_path, capsys, monkeypatch):
    """Issue 56, case 11: an --out it cannot create or write ended in a traceback (a file in its path here: root,
    who runs CI, may write a read-only folder)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n")
    (tmp_path / "taken").write_text("")
    monkeypatch.setattr(bulk, "draw", lambda *args: pytest.fail("drew with an --out it cannot write"))
    assert bulk.main([str(prompts), "--out", str(tmp_path / "taken" / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"bulk: error: cannot write to --out {tmp_path / 'taken' / 'out'} (")
    assert err.endswith("): make it a folder this user can write, or choose another --out\n")
    assert "Traceback" not in err


def test_a_disk_that_fills_midway_keeps_what_was_drawn_and_says_to_rerun(tmp_path, capsys, monkeypatch):
    """Issue 56, case 11: no space left midway ended in a traceback, although every image written is kept and the
    same command resumes. The third image finds the disk full; the rerun draws only the prompts not drawn."""
    from ssd_pipelines.serving import bulk_store

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"prompt {i}\n" for i in range(5)))
    out = tmp_path / "out"

    def batch(indices):
        records = [json.dumps({"index": i, "prompt": f"prompt {i}", "seed": i}) for i in indices]
        pngs = np.array([f"png {i}".encode() for i in indices], dtype=object)
        return {"index": np.array(indices), "png": pngs, "record": np.array(records)}

    drawn = []

    def draw(args, job, output, todo, total, done):
        indices = [index for index, _ in todo]
        drawn.append(indices)
        return bulk.store(output, [batch(indices[:2]), batch(indices[2:])], NoBar())

    class NoBar:
        def update(self):
            pass

    written = bulk_store._write_atomically

    def full_disk(path, data):
        if path.name == "000002.png":
            raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no file named
        written(path, data)

    monkeypatch.setattr(bulk, "draw", draw)
    with monkeypatch.context() as patch:
        patch.setattr(bulk_store, "_write_atomically", full_disk)
        assert bulk.main([str(prompts), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"bulk: error: cannot write {out / 'images' / '000002.png'} (No space left on device): the 2 images drawn "
        f"are kept in {out}; free space there or choose another --out, and run the same command again: it draws "
        "only the prompts not drawn yet.\n"
    )
    assert bulk.main([str(prompts), "--out", str(out)]) == 0
    assert drawn == [[0, 1, 2, 3, 4], [2, 3, 4]]
    assert sorted(p.name for p in (out / "images").iterdir() if not p.name.startswith(".")) == [
        f"{i:06d}.png" for i in range(5)
    ]


def test_seeds_follow_the_rule_of_every_face_prompt_n_drawing_from_seed_plus_n(tmp_path, capsys):
    """seeds.py's rule: the last line's seed, seed + N, must stay in range too."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle\n\na blue square\n")  # three lines: seeds seed .. seed + 2
    for seed, last in [(-1, MAX_SEED - 2), (MAX_SEED - 1, MAX_SEED - 2)]:
        with pytest.raises(SystemExit):
            bulk.parse_args([str(prompts), "--out", str(tmp_path / "out"), "--seed", str(seed)])
        assert f"--seed must be a whole number from 0 to {last} (image j of 3" in capsys.readouterr().err
    assert (
        bulk.parse_args([str(prompts), "--out", str(tmp_path / "out"), "--seed", str(MAX_SEED - 2)]).seed
        == MAX_SEED - 2
    )


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "stats.jsonl").read_text().splitlines() if line.strip()]


def start(prompts: Path, out: Path, address: str, log: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "ssd_pipelines.serving.bulk", str(prompts), "--out", str(out)]
    command += [
        "--address",
        address,
        *["--decoding", "ssd", "--verify-rounds", "1", "--seed", "5", "--batch-size", "2"],
    ]
    with open(log, "ab") as sink:
        return subprocess.Popen(
            command, cwd=REPO, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )


def test_the_bulk_job_resumes_after_a_kill_without_redoing_a_prompt(ray_cluster, tmp_path):
    prompts, out, log = tmp_path / "prompts.txt", tmp_path / "out", tmp_path / "bulk.log"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    wanted = {i for i, p in enumerate(PROMPTS) if p}
    started = time.perf_counter()
    first = start(prompts, out, ray_cluster.address, log)
    try:
        deadline = time.monotonic() + RUN_S
        while not ((out / "stats.jsonl").exists() and len(records(out)) >= 2):
            assert first.poll() is None, f"the job ended before it was killed:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"no images after {RUN_S} s:\n{log.read_text()[-3000:]}"
            time.sleep(0.1)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # its own process group: only the job this test started
        first.wait(timeout=30)
    killed_at = time.perf_counter() - started
    before = {r["index"]: r for r in records(out)}
    assert 2 <= len(before) < len(wanted), "the job finished before it could be killed: add prompts"
    stamps = {i: (out / r["image"]).stat().st_mtime_ns for i, r in before.items()}

    second = start(prompts, out, ray_cluster.address, log)
    try:
        assert second.wait(timeout=RUN_S) == 0, log.read_text()[-3000:]
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait(timeout=30)
    print(f"killed after {killed_at:.1f} s with {len(before)} drawn; whole job {time.perf_counter() - started:.1f} s")
    assert f"{len(before)} drawn already, {len(wanted) - len(before)} to draw" in log.read_text()

    every = records(out)
    assert sorted(r["index"] for r in every) == sorted(wanted)  # each prompt once: none redone, none missing
    assert all("error" not in r for r in every) and len({r["run"] for r in every}) == 2
    assert {i: (out / r["image"]).stat().st_mtime_ns for i, r in before.items()} == stamps  # left as they were
    assert all(r["seed"] == 5 + r["index"] and r["prompt"] == PROMPTS[r["index"]] for r in every)
    assert sorted(p.name for p in (out / "images").iterdir()) == [f"{i:06d}.png" for i in sorted(wanted)]

    # An image is the one its seed gives in a direct call, whatever batch it was drawn in.
    pipe = SSDAutoregressivePipeline.from_pretrained(BUNDLED_MODEL)
    pipe.set_progress_bar_config(disable=True)
    record = max(every, key=lambda r: r["index"])
    seed = 5 + record["index"]
    direct = pipe(record["prompt"], decoding="ssd", verify_rounds=1, generator=[torch.Generator().manual_seed(seed)])
    drawn = np.asarray(PIL.Image.open(out / record["image"]).convert("RGB")).astype(int)
    # The same codes; the VQ decoder's convolutions round a batch of two and an image alone a little differently
    # (a pixel off by 1), and one different code would change a whole 4 x 4 patch.
    assert np.abs(drawn - np.asarray(direct.images[0]).astype(int)).max() <= 2
