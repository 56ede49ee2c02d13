"""Serving on Ray Serve (ssd_pipelines/serving): the HTTP API, batching, seeds, bad input, slow and idle clients,
a replica's death, `ssd-serve`'s stop.

The batching tests first run without Ray on a tiny pipeline. The HTTP tests run the bundled reference model on
two replicas of a local Ray that the session starts (tests/ray_cluster.py); every wait has a deadline.
"""

from __future__ import annotations

import base64
import http.client
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import PIL.Image
import pytest
import torch

from ssd_pipelines import SSDAutoregressivePipeline
from ssd_pipelines.decoding import STRATEGIES
from ssd_pipelines.hub import BUNDLED_MODEL
from ssd_pipelines.serving.batching import run_batch
from ssd_pipelines.serving.request import GenerateRequest, Limits, generators, max_body_bytes, prepare
from ssd_pipelines.testing import tiny_pipeline

APP = "ssd-test"
STARTUP_S, REQUEST_S = 240, 180
FAST = {"decoding": "ssd", "verify_rounds": 1}  # the reference model's quickest decoding (36 passes)
BODY_TIMEOUT_S, KEEP_ALIVE_TIMEOUT_S = 6.0, 2  # the test server's, short: the tests wait them out


# --- batching, without Ray --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    return tiny_pipeline()


def test_a_batch_runs_one_call_per_group_of_identical_options(tiny):
    bodies = [
        {"prompt": "a red circle", "seed": 1, "decoding": "ssd", "verify_rounds": 1},
        {"prompt": "blue", "seed": 2, "decoding": "ssd", "verify_rounds": 1, "num_images": 2},
        {"prompt": "a red circle", "seed": 3, "decoding": "ssd"},  # verify_rounds left out: ssd's default, 2
        {"prompt": "a red circle", "seed": 4, "decoding": "ssd", "verify_rounds": 2},  # the same as leaving it out
        {"prompt": "green", "seed": 5, "decoding": "ar"},
    ]
    jobs = [prepare(tiny, GenerateRequest(**body)) for body in bodies]
    results = run_batch(tiny, jobs)
    calls = [r.stats["serving"]["call_requests"] for r in results]
    assert calls == [2, 2, 2, 2, 1]
    assert [r.stats["serving"]["call_images"] for r in results] == [3, 3, 2, 2, 1]
    assert all(r.stats["serving"]["batch_size"] == 5 for r in results)
    assert [len(r.images) for r in results] == [1, 2, 1, 1, 1] and results[4].stats["strategy"] == "ar"
    for job, result in zip(jobs, results):  # each image is the one its seed gives alone
        alone = tiny(
            job.prompt,
            num_images_per_prompt=job.num_images,
            generator=generators(job.seeds()),
            output_type="latent",
            **{k: v for k, v in job.call_options().items() if k != "output_type"},
        )
        assert torch.equal(alone.codes, result.codes)


@pytest.mark.filterwarnings("ignore:.*unknown to this model")  # the tiny tokenizer reads no words
def test_a_failing_call_is_rerun_job_by_job_so_the_others_get_their_images(tiny, monkeypatch):
    jobs = [prepare(tiny, GenerateRequest(prompt=p, seed=i)) for i, p in enumerate(["red", "poison", "blue"])]
    real_call = type(tiny).__call__

    def call(self, prompt, **kwargs):
        if "poison" in ([prompt] if isinstance(prompt, str) else prompt):
            raise RuntimeError("this prompt breaks the decoder")
        return real_call(self, prompt, **kwargs)

    monkeypatch.setattr(type(tiny), "__call__", call)
    results = run_batch(tiny, jobs)
    assert isinstance(results[1], RuntimeError) and "breaks" in str(results[1])
    assert len(results[0].images) == len(results[2].images) == 1


def test_a_request_is_refused_before_batching_with_the_pipelines_message(tiny):
    with pytest.raises(ValueError) as direct:
        tiny("a red circle", decoding="ar", verify_rounds=1)
    with pytest.raises(ValueError) as served:
        prepare(tiny, GenerateRequest(prompt="a red circle", decoding="ar", verify_rounds=1))
    assert str(served.value) == str(direct.value)
    with pytest.raises(ValueError, match="at most 2 images a request"):
        prepare(tiny, GenerateRequest(prompt="a red circle", num_images=3), Limits(max_images_per_request=2))


def test_a_prompt_longer_than_the_model_reads_is_refused_before_it_is_tokenized(tiny, monkeypatch):
    """A 20 MB prompt took 98 s to tokenize (issue 56): `prepare` refuses it first, in the pipeline's words."""
    chars = tiny.max_prompt_chars
    for field in ("prompt", "negative_prompt"):
        long = {"prompt": "a red circle", field: "a" * (chars + 1)}
        with pytest.raises(ValueError) as expected:
            tiny(**long, guidance_scale=3.0, output_type="latent")

        def tokenize(*args, **kwargs):
            raise AssertionError("tokenized a prompt longer than the model reads")

        with monkeypatch.context() as patch:
            patch.setattr(type(tiny.image_backbone), "encode_prompts", tokenize)
            with pytest.raises(ValueError) as refused:
                prepare(tiny, GenerateRequest(**long, guidance_scale=3.0))
        assert str(refused.value) == str(expected.value) and f"{chars:,}" in str(refused.value)


def test_ssd_serve_help_lists_its_options(capsys):
    from importlib.metadata import entry_points

    from ssd_pipelines.serving import cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--model",
        "--replicas",
        "--autoscaling",
        "--max-batch-size",
        "--batch-wait-timeout-s",
        "--port",
        "--host",
        "--address",
        "--threads",
        "--gpus-per-replica",
        "--body-timeout-s",
        "--keep-alive-timeout-s",
    ):
        assert flag in text
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "ssd-serve"]
    assert script.value == "ssd_pipelines.serving.cli:main"
    with pytest.raises(SystemExit):
        cli.parse_args(["--replicas", "2", "--autoscaling", '{"max_replicas": 2}'])
    assert "not both" in capsys.readouterr().err


# --- the HTTP API on Ray Serve ------------------------------------------------------------------------------------


class Server:
    def __init__(self, url: str):
        self.url = url
        parts = urllib.parse.urlsplit(url)
        self.address = (parts.hostname, parts.port)

    def get(self, path: str) -> dict:
        with urllib.request.urlopen(self.url + path, timeout=30) as response:
            return json.load(response)

    def post(self, body: dict, timeout: float = REQUEST_S) -> tuple[int, dict | bytes, dict]:
        """(status, JSON or PNG bytes, headers) of a POST /generate; HTTP errors are answers too."""
        return self.send("POST", "/generate", json.dumps(body).encode(), {"Content-Type": "application/json"}, timeout)

    def send(self, method: str, path: str, data: bytes = b"", headers: dict | None = None, timeout: float = 60):
        """Any request, as given: http.client adds no Content-Type of its own (urllib adds a form's)."""
        connection = http.client.HTTPConnection(urllib.parse.urlsplit(self.url).netloc, timeout=timeout)
        try:
            connection.request(method, path, body=data, headers=headers or {})
            response = connection.getresponse()
            status, payload, headers = response.status, response.read(), dict(response.getheaders())
        finally:
            connection.close()
        if headers.get("content-type", headers.get("Content-Type", "")).startswith("application/json"):
            payload = json.loads(payload)
        return status, payload, headers


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def within(seconds: float, what: str, work):
    """Run `work()` in a thread; fail the test (not hang it) if it takes longer than `seconds`."""
    result: dict = {}

    def target():
        try:
            result["value"] = work()
        except BaseException as error:  # noqa: BLE001 (raised below)
            result["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{what} took over {seconds} s")
    if "error" in result:
        raise result["error"]
    return result.get("value")


def raw_request(server: Server, head: str, body: bytes = b"") -> socket.socket:
    """A connection that sent `head` (the request line and headers) and `body`, and then nothing."""
    connection = socket.create_connection(server.address)
    connection.sendall(head.encode() + b"\r\n\r\n" + body)
    return connection


def answered(connection: socket.socket) -> bool:
    """The server sent something on this connection, or closed it."""
    return bool(select.select([connection], [], [], 0)[0])


def read_answer(connection: socket.socket, timeout: float) -> tuple[int, dict]:
    connection.settimeout(timeout)
    response = http.client.HTTPResponse(connection)
    response.begin()
    return response.status, json.loads(response.read())


def wait_closed(connections: list[socket.socket], seconds: float) -> list[socket.socket]:
    """Those of `connections` the server has not closed within `seconds`."""
    deadline, waiting = time.monotonic() + seconds, set(connections)
    while waiting and time.monotonic() < deadline:
        for connection in select.select(list(waiting), [], [], 0.5)[0]:
            try:
                assert connection.recv(1) == b"", "an idle connection was sent data"
            except ConnectionResetError:
                pass
            waiting.discard(connection)
    return list(waiting)


@pytest.fixture(scope="module")
def server(ray_cluster):
    from ray import serve

    from ssd_pipelines.serving import timeouts
    from ssd_pipelines.serving.deployment import build_app

    port = free_port()
    timeouts.start("127.0.0.1", port, KEEP_ALIVE_TIMEOUT_S)
    app = build_app(
        BUNDLED_MODEL,
        num_replicas=2,
        ray_actor_options={"num_cpus": 0.5},
        max_batch_size=8,
        batch_wait_timeout_s=0.25,  # long enough for 16 requests sent at once to meet in batches
        threads=1,
        body_timeout_s=BODY_TIMEOUT_S,
    )
    started = time.perf_counter()
    try:
        within(STARTUP_S, "starting two replicas", lambda: serve.run(app, name=APP, route_prefix="/"))
        print(f"serve.run: {time.perf_counter() - started:.1f} s")
        yield Server(f"http://127.0.0.1:{port}")
    finally:
        within(120, "serve.shutdown", serve.shutdown)


@pytest.fixture(scope="module")
def pipe():
    pipe = SSDAutoregressivePipeline.from_pretrained(BUNDLED_MODEL)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def direct_generator(seed: int, images: int) -> list[torch.Generator]:
    """What a direct call passes to draw what the server drew for `seed`: image j from seed + j."""
    return [torch.Generator().manual_seed(seed + j) for j in range(images)]


def decoded_png(data: bytes) -> np.ndarray:
    return np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))


def test_health_and_info(server, pipe):
    assert server.get("/health")["status"] == "ok"
    info = server.get("/info")
    assert info["model"] == str(BUNDLED_MODEL) and info["image_size"] == {"height": 64, "width": 64}
    assert info["image_sizes"] == [{"height": 64, "width": 64}] and info["grid"]["rows"] == 16
    assert info["default_decoding"] == "auto" and info["default_guidance_scale"] == 3.0
    assert set(info["decodings"]) == set(STRATEGIES)
    for name, cls in STRATEGIES.items():  # read from the strategies' declarations
        described = info["decodings"][name]
        assert described["lossless"] == cls.lossless and described["summary"] == cls.summary
        assert described["available"] and described["options"] == {
            o.name: {"default": o.default, "minimum": o.minimum, "about": o.about} for o in cls.options
        }
    assert info["decodings"]["ssd"]["options"]["verify_rounds"]["default"] == 2
    assert info["decodings"]["exact"]["lossless"] and not info["decodings"]["ssd"]["lossless"]
    assert info["serving"]["max_batch_size"] == 8 and "verify_rounds" in info["request_fields"]
    chars = pipe.max_prompt_chars
    assert info["limits"] == {
        "max_prompt_chars": chars,
        "max_body_bytes": max_body_bytes(chars),
        "body_timeout_s": BODY_TIMEOUT_S,
    }


@pytest.mark.parametrize(
    "body, direct",
    [
        ({"prompt": "a red circle", "decoding": "nope"}, {"decoding": "nope"}),
        ({"prompt": "a red circle", "decoding": "ar", "window": 3}, {"decoding": "ar", "window": 3}),
        (
            {"prompt": "a red circle", "decoding": "exact", "verify_rounds": 1},
            {"decoding": "exact", "verify_rounds": 1},
        ),
        ({"prompt": ""}, {"prompt": ""}),
        ({"prompt": "   "}, {"prompt": "   "}),
        ({"prompt": "a red circle", "height": 100}, {"height": 100}),
        ({"prompt": "a red circle", "width": 64.5}, {"width": 64.5}),
        ({"prompt": "a red circle", "num_images": 2.5}, {"num_images_per_prompt": 2.5}),
        ({"prompt": "a red circle", "temperature": -1}, {"temperature": -1}),
        ({"prompt": "a red circle", "verify_rounds": 1.5}, {"verify_rounds": 1.5}),
        ({"prompt": "a red circle", "decoding": "exact", "window": 10**9}, {"decoding": "exact", "window": 10**9}),
        ({"prompt": "a red circle", "guidance_scale": 1e308}, {"guidance_scale": 1e308}),
    ],
    ids=lambda v: json.dumps(v) if isinstance(v, dict) else str(v),
)
def test_bad_input_gets_400_with_the_pipelines_message(server, pipe, body, direct):
    with pytest.raises(ValueError) as expected:
        pipe(**{"prompt": "a red circle", **direct}, output_type="latent")
    status, answer, _ = server.post(body, timeout=60)
    assert status == 400 and answer == {"error": str(expected.value)}


@pytest.mark.parametrize(
    "body, says",
    [
        ({"prompt": "a red circle", "verify_round": 1}, "verify_round: Extra inputs are not permitted"),
        ({"prompt": 3}, "prompt: Input should be a valid string"),
        ({"seed": 1}, "prompt: Field required"),
        ({"prompt": "a red circle", "num_images": 2, "response": "png"}, "ask response='json'"),
        ({"prompt": "a red circle", "num_images": 9}, "at most 8 images a request"),
    ],
)
def test_bodies_the_pipeline_never_sees_get_400_too(server, body, says):
    status, answer, _ = server.post(body, timeout=60)
    assert status == 400 and says in answer["error"]


EXAMPLE = '{"prompt": "a red circle"}'
SEND_JSON = f"send a JSON object such as {EXAMPLE} with Content-Type: application/json."
JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize(
    "method, path, data, headers, status, error",
    [
        ("POST", "/generate", b"", JSON, 400, f"the body is empty: {SEND_JSON}"),
        (
            "POST",
            "/generate",
            b'{"prompt": "a red circle"}',
            {"Content-Type": "text/plain"},
            400,
            f"the body was sent as text/plain, not as JSON: {SEND_JSON}",
        ),
        (  # what `curl -d` sends unless told otherwise
            "POST",
            "/generate",
            b'{"prompt": "a red circle"}',
            {"Content-Type": "application/x-www-form-urlencoded"},
            400,
            f"the body was sent as application/x-www-form-urlencoded, not as JSON: {SEND_JSON}",
        ),
        (
            "POST",
            "/generate",
            b'{"prompt": "a red circle"}',
            {},
            400,
            f"the body was sent without a Content-Type, not as JSON: {SEND_JSON}",
        ),
        (
            "POST",
            "/generate",
            b"{not json",
            JSON,
            400,
            f"the body is not JSON (Expecting property name enclosed in double quotes at character 1): {SEND_JSON}",
        ),
        (
            "POST",
            "/generate",
            '{"prompt": "un café"}'.encode("latin-1"),
            JSON,
            400,
            "the body is not UTF-8 (byte 0xe9 at position 18): encode it in UTF-8.",
        ),
        (  # Python's json gives up with a RecursionError (1,000 levels), in a body shorter than the cap
            "POST",
            "/generate",
            b"[" * 1500 + b"]" * 1500,
            JSON,
            400,
            f"the body is nested too deeply to be a request: send a flat JSON object such as {EXAMPLE}.",
        ),
        (
            "POST",
            "/generate",
            b'[{"prompt": "a red circle"}]',
            JSON,
            400,
            f"the body is an array, not a JSON object: send an object such as {EXAMPLE}.",
        ),
        (
            "POST",
            "/generate",
            b'"a red circle"',
            JSON,
            400,
            f"the body is a string, not a JSON object: send an object such as {EXAMPLE}.",
        ),
        (
            "GET",
            "/generat",
            b"",
            {},
            404,
            "there is no GET /generat: use POST /generate, GET /health or GET /info (see GET /docs).",
        ),
        ("GET", "/generate", b"", {}, 405, "GET /generate is not allowed: send POST /generate."),
        ("POST", "/health", b"", {}, 405, "POST /health is not allowed: send GET /health."),
    ],
    ids=[
        "empty",
        "text",
        "form",
        "no-content-type",
        "not-json",
        "not-utf8",
        "nested-1500",
        "array",
        "string",
        "no-route",
        "get-generate",
        "post-health",
    ],
)
def test_every_error_is_one_sentence_under_error(server, method, path, data, headers, status, error):
    """Whatever refuses a request (our checks, FastAPI's body parsing, Starlette's routing), the answer has one
    shape: {"error": a sentence that says what to change}, never FastAPI's `detail`."""
    answered, answer, _ = server.send(method, path, data, headers)
    assert (answered, answer) == (status, {"error": error})


def test_a_fault_nothing_caught_answers_500_in_the_same_shape():
    """Outside a replica the ingress cannot find its server: an unforeseen fault, answered as JSON, not plain text."""
    from ray_cluster import require_ray

    require_ray()
    from fastapi.testclient import TestClient
    from ray import serve
    from ray.serve.exceptions import RayServeException

    from ssd_pipelines.serving.deployment import api

    with pytest.raises(RayServeException) as fault:
        serve.get_replica_context()
    answer = TestClient(api, raise_server_exceptions=False).get("/health")
    assert answer.status_code == 500 and answer.json() == {
        "error": f"the server failed (RayServeException: {fault.value}): "
        "retry the request, and report the fault if it happens again."
    }


def test_the_openapi_docs_show_the_error_shape(server):
    """The docs still serve, and document the one error shape instead of FastAPI's 422 with `detail`."""
    assert server.send("GET", "/docs")[0] == 200
    status, spec, _ = server.send("GET", "/openapi.json")
    responses = spec["paths"]["/generate"]["post"]["responses"]
    assert status == 200 and "422" not in responses
    assert responses["400"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorAnswer"}
    assert spec["components"]["schemas"]["ErrorAnswer"]["required"] == ["error"]


def test_sixteen_concurrent_requests_are_answered_in_batches_and_seeds_hold(server, pipe):
    """16 requests at once, two option sets: all answered, some in batches > 1 and sharing pipeline calls, each
    image the one its seed gives in a direct call of its own."""
    prompts = ["a red circle", "two blue squares", "a yellow cross left of a green ring"]
    bodies = [
        {"prompt": prompts[i % 3], "seed": 100 + i, **FAST, **({"temperature": 0.8} if i % 4 == 3 else {})}
        for i in range(16)
    ]
    bodies[5] |= {"num_images": 2}
    started = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(server.post, bodies, timeout=REQUEST_S + 30))
    print(f"16 concurrent requests: {time.perf_counter() - started:.1f} s")
    assert [status for status, _, _ in answers] == [200] * 16, [a for s, a, _ in answers if s != 200]
    serving = [answer["stats"]["serving"] for _, answer, _ in answers]
    assert max(s["batch_size"] for s in serving) > 1, serving
    assert all(s["call_requests"] <= s["batch_size"] for s in serving)
    assert len({s["replica"] for s in serving}) == 2  # both replicas took requests
    assert max(s["call_requests"] for s in serving) > 1  # requests shared pipeline calls
    assert [len(answer["images"]) for _, answer, _ in answers] == [2 if i == 5 else 1 for i in range(16)]
    batched = [i for i, s in enumerate(serving) if s["call_requests"] > 1] or [0]
    for i in sorted({batched[0], 3, 5}):  # a batched one, one of the other options, the two-image one
        body, answer = bodies[i], answers[i][1]
        options = {k: v for k, v in body.items() if k not in ("prompt", "seed", "num_images")}
        count = body.get("num_images", 1)
        direct = pipe(
            body["prompt"],
            num_images_per_prompt=count,
            generator=direct_generator(body["seed"], count),
            **options,
        )
        assert answer["codes"] == direct.codes.tolist(), f"request {i}: {serving[i]}"
        for encoded, image in zip(answer["images"], direct.images):  # rounding of a batched VQ decoder: +-1
            assert np.abs(decoded_png(base64.b64decode(encoded)).astype(int) - np.asarray(image)).max() <= 2


def test_png_response_is_the_image_with_its_stats_in_headers(server, pipe):
    status, png, headers = server.post({"prompt": "three green triangles", "seed": 7, "response": "png", **FAST})
    assert status == 200 and png.startswith(b"\x89PNG")
    headers = {k.lower(): v for k, v in headers.items()}
    assert json.loads(headers["x-ssd-stats"])["serving"]["batch_size"] >= 1
    direct = pipe("three green triangles", generator=direct_generator(7, 1), **FAST)
    assert np.abs(decoded_png(png).astype(int) - np.asarray(direct.images[0])).max() <= 2


HEAD = "POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {length}"


def test_bodies_that_stall_hold_no_replica_and_get_408(server):
    """40 requests whose body stops halfway, more than the two replicas' 32 slots (issue 56: 17 stalled one
    replica's 16): /health and /generate answer while they still wait, and each of them gets 408 at the timeout."""
    stalled = [raw_request(server, HEAD.format(length=1000), b'{"prompt": "a red') for _ in range(40)]
    try:
        started = time.perf_counter()

        def health_and_generate():
            return server.get("/health"), server.post({"prompt": "a red circle", **FAST}, timeout=BODY_TIMEOUT_S)

        health, (status, _, _) = within(
            BODY_TIMEOUT_S, "/health and /generate behind 40 stalled bodies", health_and_generate
        )
        print(f"/health and /generate behind 40 stalled bodies: {time.perf_counter() - started:.2f} s")
        assert health["status"] == "ok" and status == 200
        assert not any(map(answered, stalled)), "a stalled body was refused before its timeout: this test waited less"
        answers = [read_answer(connection, BODY_TIMEOUT_S + 30) for connection in stalled]
    finally:
        for connection in stalled:
            connection.close()
    refused = f"the body did not arrive within {BODY_TIMEOUT_S:g} s of the request: send the whole body at once, right after the headers."
    assert answers == [(408, {"error": refused})] * 40


def body_limits(pipe) -> tuple[int, int]:
    chars = pipe.max_prompt_chars
    return chars, max_body_bytes(chars)


def too_large(sent: str, pipe) -> str:
    chars, most = body_limits(pipe)
    return (
        f"the body is larger than any request this server reads ({sent}, and the most is {most}: two prompts of "
        f"{chars} characters and the other fields): shorten the prompt and negative_prompt to at most {chars} "
        "characters each."
    )


def test_a_content_length_past_the_cap_gets_413_before_the_body_is_sent(server, pipe):
    _, most = body_limits(pipe)
    connection = raw_request(server, HEAD.format(length=most + 1))  # and no byte of the body
    try:
        answer = read_answer(connection, BODY_TIMEOUT_S / 2)
    finally:
        connection.close()
    assert answer == (413, {"error": too_large(f"its Content-Length says {most + 1} bytes", pipe)})


def test_a_chunked_body_past_the_cap_gets_413(server, pipe):
    _, most = body_limits(pipe)
    chunks = [b" " * 4096] * (most // 4096) + [b" " * (most % 4096 + 1)]  # one byte past the cap
    headers = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    connection = http.client.HTTPConnection(urllib.parse.urlsplit(server.url).netloc, timeout=60)
    try:
        connection.request("POST", "/generate", body=iter(chunks), headers=headers, encode_chunked=True)
        response = connection.getresponse()
        answer = response.status, json.loads(response.read())
    finally:
        connection.close()
    assert answer == (413, {"error": too_large(f"more than {most} bytes arrived", pipe)})


def test_the_longest_prompts_the_model_reads_pass_the_body_cap(server, pipe):
    """Both prompts at the model's limit, of the character JSON escapes the longest (a surrogate pair, 12 bytes):
    the body is read and drawn, not refused."""
    chars = pipe.max_prompt_chars
    widest = "\U0001f600"
    body = {"prompt": widest * chars, "negative_prompt": widest * chars, "seed": 3, **FAST}
    assert len(json.dumps(body)) > 2 * 12 * chars  # escaped as sent
    status, answer, _ = server.post(body)
    assert status == 200 and len(answer["images"]) == 1, answer


@pytest.mark.parametrize("field", ["prompt", "negative_prompt"])
def test_a_prompt_longer_than_the_model_reads_gets_400_naming_the_limit(server, pipe, field):
    chars = pipe.max_prompt_chars
    long = {"prompt": "a red circle", field: "a" * (chars + 1)}
    with pytest.raises(ValueError) as expected:
        pipe(**long, output_type="latent")
    status, answer, _ = server.post(long, timeout=60)
    assert (status, answer) == (400, {"error": str(expected.value)}) and f"{chars:,}" in answer["error"]


def test_connections_that_send_nothing_are_closed_after_the_keep_alive_timeout(server):
    """200 connections that never send a request (issue 56: never closed): open at half the timeout, closed after."""
    idle = [socket.create_connection(server.address) for _ in range(200)]
    try:
        time.sleep(KEEP_ALIVE_TIMEOUT_S / 2)
        assert not any(map(answered, idle)), "closed before the keep-alive timeout"
        still_open = wait_closed(idle, KEEP_ALIVE_TIMEOUT_S + 30)
    finally:
        for connection in idle:
            connection.close()
    assert not still_open, f"{len(still_open)} of 200 idle connections still open"


def replica_names() -> list[str]:
    import ray

    from ssd_pipelines.serving.deployment import DEPLOYMENT_NAME

    prefix = f"SERVE_REPLICA::{APP}#{DEPLOYMENT_NAME}#"  # this test's own application only
    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(prefix))


def test_a_replica_killed_under_load_is_replaced_and_no_request_hangs(server):
    import ray
    from ray import serve

    before = replica_names()
    assert len(before) == 2, before
    bodies = [{"prompt": "a blue ring", "seed": 200 + i, **FAST} for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(server.post, body) for body in bodies]
        time.sleep(1.5)  # the requests are queued or decoding on both replicas
        ray.kill(ray.get_actor(before[0], namespace="serve"), no_restart=True)
        answers = [future.result(timeout=REQUEST_S + 30) for future in futures]
    for status, answer, _ in answers:  # an image, or an error that says so: never a hang
        assert (status == 200 and len(answer["images"]) == 1) or (status >= 500 and answer), (status, answer)
    failed = next((answer for status, answer, _ in answers if status != 200), None)
    print(f"killed {before[0]}: {[status for status, _, _ in answers]}, a failed one said {failed!r}")

    deadline = time.monotonic() + STARTUP_S
    while True:
        names = replica_names()
        status = serve.status().applications[APP]
        running = status.deployments["SSDServer"].replica_states.get("RUNNING", 0)
        if status.status == "RUNNING" and running == 2 and before[0] not in names and len(names) == 2:
            break
        assert time.monotonic() < deadline, f"Serve did not replace the replica: {status}, {names}"
        time.sleep(1)
    with ThreadPoolExecutor(4) as pool:
        later = list(pool.map(server.post, bodies[:4], timeout=REQUEST_S + 30))
    assert [status for status, _, _ in later] == [200] * 4


STOP_S = 60
STOP_WORDS = ("failed", "Traceback", "retries remaining")  # what Serve's shutdown logged (issue 56)


def test_ssd_serve_stops_cleanly_on_sigterm(tmp_path):
    """`ssd-serve` on its own local Ray: its proxies close an idle connection after --keep-alive-timeout-s, and
    SIGTERM stops it with status 0, and nothing failed or retried in its output."""
    from ray_cluster import require_ray

    require_ray()
    port, log = free_port(), tmp_path / "ssd-serve.log"
    command = [sys.executable, "-m", "ssd_pipelines.serving.cli", "--port", str(port), "--num-cpus", "1"]
    environment = {name: value for name, value in os.environ.items() if name != "RAY_ADDRESS"}
    with log.open("w") as output:
        process = subprocess.Popen(
            [*command, "--keep-alive-timeout-s", "1"], stdout=output, stderr=subprocess.STDOUT, env=environment
        )
    try:
        wait_healthy(Server(f"http://127.0.0.1:{port}"), process, log)
        idle = socket.create_connection(("127.0.0.1", port))
        assert not wait_closed([idle], 1 + 10), "an idle connection outlived --keep-alive-timeout-s 1"
        idle.close()
        process.send_signal(signal.SIGTERM)
        started = time.perf_counter()
        status = process.wait(timeout=STOP_S)
        print(f"ssd-serve stopped {time.perf_counter() - started:.1f} s after SIGTERM")
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    text = log.read_text()
    assert status == 0, text[-3000:]
    assert [line for line in text.splitlines() if any(word in line for word in STOP_WORDS)] == []


def wait_healthy(server: Server, process: subprocess.Popen, log) -> None:
    deadline = time.monotonic() + STARTUP_S
    while True:
        assert process.poll() is None, f"ssd-serve exited with {process.returncode}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"ssd-serve not healthy in {STARTUP_S} s: {log.read_text()[-3000:]}"
        try:
            if server.get("/health")["status"] == "ok":
                return
        except OSError:  # not listening yet, or the application not deployed yet
            time.sleep(1)
