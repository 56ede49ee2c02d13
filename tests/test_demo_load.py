"""A burst of 8 requests against a queue of concurrency 1 and size 4: each completes or is refused as queue full,
the server stays up, and its memory after the burst stays within 10% of before."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from demo_server import free_port, named, start_demo
from gradio_client import Client
from gradio_client.utils import QueueError

REQUEST = {"prompt": "four blue squares", "api_name": "/generate"}
BURST = 8


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory):
    """Started with --server-port, which wins over GRADIO_SERVER_PORT (start_demo sets both)."""
    args = ("--concurrency", "1", "--max-queue", "4")
    server = start_demo(tmp_path_factory.mktemp("demo-load"), *args, flag_port=free_port())
    yield server
    server.stop()


def test_a_burst_beyond_the_queue_is_refused_cleanly_and_leaves_memory_as_it_was(small_queue_server):
    server = small_queue_server
    clients = [Client(server.url, verbose=False) for _ in range(BURST)]  # eight users
    for _ in range(2):  # warm up: the first calls allocate what every later call reuses
        clients[0].predict(**REQUEST)
    before = server.rss()

    jobs = [client.submit(**REQUEST) for client in clients]
    completed, refused = 0, []

    def outcome(job):
        try:
            return job.result(timeout=300)
        except QueueError as error:
            return error

    with ThreadPoolExecutor(BURST) as pool:
        for result in pool.map(outcome, jobs):
            if isinstance(result, QueueError):
                refused.append(str(result))
            else:
                completed += 1
                assert named(clients[0], result)["Images"], "a completed request has its images"
    assert server.process.poll() is None
    clients[0].predict(**REQUEST)  # still serving
    after = server.rss()

    print(
        f"\nload: {completed} completed, {len(refused)} refused as queue full; "
        f"RSS {before / 2**20:.0f} MiB before, {after / 2**20:.0f} MiB after ({after / before - 1:+.1%})"
    )
    assert completed + len(refused) == BURST
    assert completed >= 1 and refused, "a burst of 8 on 1 + 4 places both completes and refuses requests"
    assert all("Queue is full" in message for message in refused)
    assert abs(after - before) <= 0.10 * before
