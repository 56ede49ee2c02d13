"""A burst of 8 requests against a queue of concurrency 1 and size 4: each completes or is refused as queue full,
the server stays up, and a second burst leaves its memory where the first left it.

Memory is compared burst to burst, not to a server that has served one request at a time: the first burst
allocates what later ones reuse (queue workers, allocator pools), which a leak would not stop at."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from demo_server import free_port, named, start_demo
from gradio_client import Client
from gradio_client.utils import QueueError

REQUEST = {"prompt": "four blue squares", "api_name": "/generate"}
BURST = 8
GROWTH = 48 * 2**20  # bytes a second burst may add to the first's resident memory


@pytest.fixture(scope="module")
def small_queue_server(tmp_path_factory):
    """Started with --server-port, which wins over GRADIO_SERVER_PORT (start_demo sets both)."""
    args = ("--concurrency", "1", "--max-queue", "4")
    server = start_demo(tmp_path_factory.mktemp("demo-load"), *args, flag_port=free_port())
    yield server
    server.stop()


def burst(clients: list[Client]) -> tuple[int, list[str]]:
    """Submit one request per client at once: how many completed (with images), and the refusals' messages."""
    jobs = [client.submit(**REQUEST) for client in clients]
    completed, refused = 0, []

    def outcome(job):
        try:
            return job.result(timeout=300)
        except QueueError as error:
            return error

    with ThreadPoolExecutor(len(jobs)) as pool:
        for result in pool.map(outcome, jobs):
            if isinstance(result, QueueError):
                refused.append(str(result))
            else:
                completed += 1
                assert named(clients[0], result)["Images"], "a completed request has its images"
    return completed, refused


def test_a_burst_beyond_the_queue_is_refused_cleanly_and_a_second_adds_no_memory(small_queue_server):
    server = small_queue_server
    clients = [Client(server.url, verbose=False) for _ in range(BURST)]  # eight users
    burst(clients)  # warm up
    before = server.rss()
    completed, refused = burst(clients)
    assert server.process.poll() is None
    clients[0].predict(**REQUEST)  # still serving
    after = server.rss()

    print(
        f"\nload: {completed} completed, {len(refused)} refused as queue full; "
        f"RSS {before / 2**20:.0f} MiB after the first burst, {after / 2**20:.0f} MiB after the second"
    )
    assert completed + len(refused) == BURST
    assert completed >= 1 and refused, "a burst of 8 on 1 + 4 places both completes and refuses requests"
    assert all("Queue is full" in message for message in refused)
    assert after - before <= GROWTH
