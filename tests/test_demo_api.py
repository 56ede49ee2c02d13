"""The demo's `/generate` endpoint through gradio_client: image files, the pipeline's errors, concurrent runs."""

import time

import numpy as np
import PIL.Image
import pytest
import torch
from demo_server import named
from gradio_client import Client
from gradio_client.exceptions import AppError

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.hub import BUNDLED_MODEL

PROMPT = "a red circle left of a blue square"


@pytest.fixture(scope="module")
def client(demo_server):
    return Client(demo_server.url, verbose=False)


def images(outputs: dict, gallery: str = "Images") -> list[np.ndarray]:
    return [np.asarray(PIL.Image.open(item["image"])) for item in outputs[gallery]]


def test_generate_returns_png_files_the_seed_and_the_statistics(client):
    outputs = named(client, client.predict(prompt=PROMPT, seed=7, num_images=2, api_name="/generate"))
    drawn = images(outputs)
    assert len(drawn) == 2 and all(image.shape == (64, 64, 3) and image.any() for image in drawn)
    assert all(PIL.Image.open(item["image"]).format == "PNG" for item in outputs["Images"])
    assert outputs["Seed"] == 7
    # two images: past auto's crossover (one image), so ar decoded them
    assert outputs["Status"].startswith("auto (ar): done, 16 rows in") and "forward passes" in outputs["Statistics"]


def test_bad_input_comes_back_as_the_pipelines_message(client):
    pipe = SSDAutoregressivePipeline.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    with pytest.raises(ValueError) as expected:
        pipe("")
    with pytest.raises(AppError) as returned:
        client.predict(prompt="", api_name="/generate")
    assert str(returned.value) == str(expected.value)


def test_two_concurrent_generations_equal_the_same_runs_one_after_the_other(client):
    """The server runs two generations at once on its one pipeline (--concurrency 2); neither disturbs the other."""
    requests = [
        {"prompt": PROMPT, "seed": 11, "decoding": "ssd", "num_images": 2},
        {"prompt": "three green triangles", "seed": 12, "verify_rounds": 1, "vertical_rows": 2},
    ]
    alone = [images(named(client, client.predict(**r, api_name="/generate"))) for r in requests]
    jobs = [client.submit(**r, api_name="/generate") for r in requests]
    overlapped = False
    while not any(job.done() for job in jobs):
        # both have streamed an update and neither has finished: they run at the same time
        overlapped = overlapped or all(job.outputs() for job in jobs)
        time.sleep(0.02)  # poll the jobs' state
    together = [images(named(client, job.result(timeout=120))) for job in jobs]
    assert overlapped
    for one, other in zip(alone, together, strict=True):
        assert len(one) == len(other) and all(np.array_equal(a, b) for a, b in zip(one, other))


@pytest.mark.parametrize(
    ("values", "argument"),
    [
        ({"num_images": 2.5}, {"num_images_per_prompt": 2.5}),
        ({"decoding": "ssd", "verify_rounds": 2.7}, {"decoding": "ssd", "verify_rounds": 2.7}),
        ({"top_k": 0.5}, {"top_k": 0.5}),
    ],
)
def test_fractional_integers_are_refused_with_the_pipelines_message(client, values, argument):
    """Not truncated by int(): a 2.7 is a caller's mistake, not a 2."""
    pipe = SSDAutoregressivePipeline.from_pretrained(BUNDLED_MODEL, dtype=torch.float32)
    with pytest.raises(ValueError) as expected:
        pipe(PROMPT, **argument)
    with pytest.raises(AppError) as returned:
        client.predict(prompt=PROMPT, **values, api_name="/generate")
    assert str(returned.value) == str(expected.value)


def test_what_the_tokenizer_cut_from_the_prompt_comes_back_in_the_status(client):
    outputs = named(client, client.predict(prompt="four blue squares " * 5, api_name="/generate"))
    assert outputs["Status"].startswith("auto (exact): done")
    assert "**Prompt changed:** the prompt 'four blue squares" in outputs["Status"]
    assert "has 15 tokens and this model reads at most 14: only the first 14 were used." in outputs["Status"]
