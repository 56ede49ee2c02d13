"""The calls the README and the pipeline's docstring show work as written, on the shipped reference model."""

import doctest
import re
import shlex
from pathlib import Path

import PIL.Image
import pytest
import torch

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.fixture
def in_a_fresh_folder(tmp_path, monkeypatch):
    """A working folder like a user's checkout: the examples name `hub_cards/ssd-reference` relative to it."""
    (tmp_path / "hub_cards").symlink_to(ROOT / "hub_cards")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def code_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


@pytest.fixture
def torchs_default_threads():
    """Two threads, as torch starts on this 2-core machine (the tests themselves run on one): for the examples to
    set what a user's fresh process would need."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def test_the_readme_python_example_runs(in_a_fresh_folder, torchs_default_threads):
    """It sets one thread (issue 56, case 14: without it the example ran 5-23x slower than the CLI on a busy CPU)."""
    (example,) = code_blocks("python")
    exec(compile(example, "README.md", "exec"), {})  # noqa: S102 - our own README
    assert PIL.Image.open(in_a_fresh_folder / "triangles.png").size == (64, 64)
    assert (in_a_fresh_folder / "my-pipeline" / "model_index.json").is_file()
    assert torch.get_num_threads() == 1


def test_the_readme_command_lines_run(in_a_fresh_folder, capsys):
    commands = [line for block in code_blocks("bash") for line in block.splitlines() if line.startswith("ssd-generate")]
    assert len(commands) >= 2
    for command in commands:
        assert main(shlex.split(command, comments=True)[1:]) == 0
    assert (in_a_fresh_folder / "out.png").is_file() and (in_a_fresh_folder / "out-ar-3.png").is_file()


def test_the_pipeline_docstring_example_runs(in_a_fresh_folder, torchs_default_threads):
    """The example loads without dtype, as a new user would: every decoding must then work."""
    script = doctest.script_from_examples(SSDAutoregressivePipeline.__call__.__doc__.split("Examples:")[-1])
    exec(compile(script, "pipeline_ssd.py", "exec"), {})  # noqa: S102 - our own docstring
    assert PIL.Image.open(in_a_fresh_folder / "circle.png").size == (64, 64)
    assert torch.get_num_threads() == 1
