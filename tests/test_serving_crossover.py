"""auto's crossover measured at start-up (serving/crossover.py) and passed to the requests that leave it out."""

from __future__ import annotations

import argparse

import pytest

from ssd_pipelines.decoding.options import EXACT_MAX_BATCH
from ssd_pipelines.serving import cli
from ssd_pipelines.serving.crossover import measure, measure_crossover, pick_crossover
from ssd_pipelines.serving.deployment import build_app
from ssd_pipelines.serving.request import GenerateRequest, prepare
from ssd_pipelines.testing import tiny_pipeline


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline()


def test_the_crossover_is_the_last_size_of_exacts_first_winning_run():
    assert pick_crossover({1: (1.0, 2.0), 2: (1.0, 1.5), 3: (1.2, 1.1), 4: (0.9, 1.0)}) == 2  # a late win is noise
    assert pick_crossover({1: (1.0, 2.0), 2: (1.0, 1.5), 4: (0.5, 1.0)}) == 4
    assert pick_crossover({1: (2.0, 1.0), 2: (1.0, 1.5)}) == 0
    assert pick_crossover({}) == 0


def test_measure_times_both_interleaved_and_stops_two_sizes_after_exact_falls_behind(tiny):
    exact = {1: 0.5, 2: 0.6, 3: 0.9, 4: 1.1, 6: 1.2, 8: 0.1}  # seconds per image; ar: 1.0 at every size
    calls = []

    def timer(pipe, prompts, decoding, seed):
        calls.append((decoding, len(prompts)))
        return len(prompts) * (exact[len(prompts)] if decoding == "exact" else 1.0)

    result = measure(tiny, max_batch=8, timer=timer)
    assert result.exact_max_batch == 3
    assert calls[:2] == [("exact", 1), ("ar", 1)]  # the untimed warm-up
    assert calls[2:6] == [("exact", 1), ("ar", 1), ("exact", 2), ("ar", 2)]  # interleaved
    assert sorted(result.per_image) == [1, 2, 3, 4, 6]  # slower at 4 and 6: 8 is not timed
    assert result.per_image[2] == (0.6, 1.0)
    assert measure(tiny, max_batch=2, timer=timer).exact_max_batch == 2  # never past max_batch
    assert result.as_dict()["exact_max_batch"] == 3


@pytest.mark.filterwarnings("ignore:.*unknown to this model")  # the tiny tokenizer reads no caption words
def test_measure_crossover_runs_on_a_tiny_pipeline(tiny):
    found = measure_crossover(tiny, max_batch=3)
    assert isinstance(found, int) and 0 <= found <= 3
    assert measure_crossover(tiny_pipeline(with_heads=False)) == 0  # no heads: no exact, no auto


def test_the_servers_crossover_fills_in_for_auto_requests_that_leave_it_out(tiny):
    server = {"exact_max_batch": 5}
    auto = prepare(tiny, GenerateRequest(prompt="a red circle", decoding="auto"), option_defaults=server)
    assert auto.options["exact_max_batch"] == 5
    own = prepare(
        tiny, GenerateRequest(prompt="a red circle", decoding="auto", exact_max_batch=1), option_defaults=server
    )
    assert own.options["exact_max_batch"] == 1
    ar = prepare(tiny, GenerateRequest(prompt="a red circle", decoding="ar"), option_defaults=server)
    assert "exact_max_batch" not in ar.options
    default = prepare(tiny, GenerateRequest(prompt="a red circle", decoding="auto"))
    assert default.options["exact_max_batch"] == EXACT_MAX_BATCH.default == 1


def test_ssd_serve_takes_a_crossover_or_measure():
    assert cli.parse_args(["--exact-max-batch", "measure"]).exact_max_batch == "measure"
    assert cli.parse_args(["--exact-max-batch", "0"]).exact_max_batch == 0
    assert cli.parse_args([]).exact_max_batch is None
    with pytest.raises(argparse.ArgumentTypeError):
        cli._exact_max_batch("-1")
    with pytest.raises(SystemExit):
        cli.parse_args(["--exact-max-batch", "sometimes"])
    with pytest.raises(ValueError, match="exact_max_batch must be"):
        build_app(exact_max_batch="always")
