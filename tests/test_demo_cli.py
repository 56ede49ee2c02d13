"""`ssd-demo`'s command line: what reaches Gradio's queue and launch, and a model that cannot load."""

import gradio as gr
import pytest

from app.cli import main, parse_args
from ssd_pipelines import SSDAutoregressivePipeline


def test_unset_address_and_port_are_left_to_gradio_which_reads_the_environment():
    args = parse_args([])
    assert (args.server_name, args.server_port, args.share) == (None, None, False)
    assert (args.concurrency, args.max_queue) == (1, 16)


def test_flags_reach_the_queue_and_launch(monkeypatch):
    launched, queued = {}, {}
    monkeypatch.setattr(gr.Blocks, "queue", lambda demo, **kwargs: queued.update(kwargs) or demo)
    monkeypatch.setattr(gr.Blocks, "launch", lambda demo, **kwargs: launched.update(kwargs))
    argv = ["--share", "--server-name", "0.0.0.0", "--server-port", "1234", "--concurrency", "3", "--max-queue", "5"]
    assert main(argv) == 0
    assert (launched["share"], launched["server_name"], launched["server_port"]) == (True, "0.0.0.0", 1234)
    assert queued == {"default_concurrency_limit": 3, "max_size": 5}


def test_a_model_that_cannot_load_is_reported_in_one_line(tmp_path, capsys):
    with pytest.raises(ValueError) as expected:
        SSDAutoregressivePipeline.from_pretrained(tmp_path)
    assert main(["--model", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"ssd-demo: {expected.value}\n"


def test_bad_queue_sizes_are_refused():
    with pytest.raises(SystemExit):
        parse_args(["--max-queue", "0"])
