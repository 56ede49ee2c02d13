"""One pipeline served from worker threads (Gradio's queue, ComfyUI): calls neither corrupt nor stop each other."""

import threading

import pytest
import torch

from ssd_pipelines.testing import tiny_pipeline


@pytest.fixture(scope="module")
def pipe():
    return tiny_pipeline(rows=6, cols=6)


def generate(pipe, seed, **kwargs):
    return pipe(
        ["a red circle", "blue square"],
        num_images_per_prompt=2,
        generator=torch.Generator().manual_seed(seed),
        output_type="latent",
        **kwargs,
    )


def in_threads(*calls):
    """Run each call in its own thread at once; return their results (or raise the first error)."""
    results, errors = [None] * len(calls), []

    def target(index, call):
        try:
            results[index] = call()
        except BaseException as error:  # noqa: BLE001 - surfaced below
            errors.append(error)

    threads = [threading.Thread(target=target, args=(i, call)) for i, call in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("decoding", ["ar", "ssd", "exact"])
def test_concurrent_calls_equal_sequential_ones(pipe, decoding):
    """Both calls wait for each other after every row, so their forward passes interleave all the way."""
    seeds = (1, 2)
    sequential = [generate(pipe, seed, decoding=decoding) for seed in seeds]
    rows_met = threading.Barrier(len(seeds), timeout=60)

    def lockstep(_pipe, _row, _timestep, _tensors):
        rows_met.wait()
        return {}

    concurrent = in_threads(
        *(lambda s=seed: generate(pipe, s, decoding=decoding, callback_on_step_end=lockstep) for seed in seeds)
    )
    for alone, together in zip(sequential, concurrent):
        assert torch.equal(alone.codes, together.codes)
        assert torch.equal(alone.final_round, together.final_round)
        assert alone.stats["forward_passes"] == together.stats["forward_passes"]
    assert not torch.equal(concurrent[0].codes, concurrent[1].codes)  # the seeds differ, so must the images


def test_one_calls_interrupt_does_not_stop_another(pipe):
    both_started = threading.Barrier(2, timeout=60)

    def stop_at_first_row(p, _row, _timestep, _tensors):
        both_started.wait()
        p._interrupt = True
        return {}

    def keep_going(_p, row, _timestep, _tensors):
        if row == 0:
            both_started.wait()
        return {}

    stopped, finished = in_threads(
        lambda: generate(pipe, 1, callback_on_step_end=stop_at_first_row),
        lambda: generate(pipe, 2, callback_on_step_end=keep_going),
    )
    assert stopped.interrupted and stopped.rows_completed == 1
    assert not finished.interrupted and finished.rows_completed == 6 and (finished.codes >= 0).all()
