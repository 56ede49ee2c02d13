"""The Ray Serve application: a gateway that takes the HTTP API (FastAPI), and replicas that each hold a pipeline,
concurrent requests batched.

    POST /generate   a `GenerateRequest` (JSON) -> the PNG (response="png") or JSON with base64 PNGs, codes, stats
    GET  /health     a replica is up, with its pipeline loaded
    GET  /info       the model, its image sizes, the decodings with their options, defaults and lossless flags,
                     the limits of a request and the serving settings (`exact_max_batch`: auto's crossover, given
                     or measured at start-up)

The gateway (`SSDGateway`, the application's ingress: one cheap replica that takes many requests at once) reads
a request's whole body before anything else (`BodyGuard`: at most `max_body_bytes`, within `body_timeout_s`),
then passes it to a pipeline replica (`SSDServer`) through a handle. A replica's slots (`max_ongoing_requests`)
so hold requests that have arrived, never a client that sends its body slowly or not at all: one that held a
slot each could stall /health and /generate for everyone (issue 56).
A request is validated on its replica (`request.prepare`: the pipeline's own checks; HTTP 400 with its message),
then waits for `@serve.batch` to collect it with others (up to `max_batch_size`, at most `batch_wait_timeout_s`),
and the batch runs in a worker thread (`batching.run_batch`: one pipeline call per group of identical options).
Each answer's `stats["serving"]` says what batch it ran in and how long it queued and decoded. Every error answers
`{"error": one sentence that says what to change}`, whatever refused the request (our checks, FastAPI's reading
of the body, Starlette's routing) or failed.
With `exact_max_batch="measure"` each replica times `exact` against `ar` once at start-up (serving/crossover.py)
and uses the crossover for the `auto` requests that leave `exact_max_batch` out; an int is used as given.
`build_app(...)` makes the application; `ssd-serve` (serving/cli.py) runs it.
"""

# No `from __future__ import annotations`: FastAPI reads the body model off `generate`'s annotation, and with it
# (a string) FastAPI under Serve's ingress took the body for a required query parameter and refused every request.
import asyncio

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field
from ray import serve
from ray.exceptions import RayActorError, RayTaskError
from ray.serve.deployment import Application
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle, DeploymentResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..decoding.options import EXACT_MAX_BATCH
from .batching import Generated, run_batch
from .crossover import measure
from .info import describe
from .loader import load_worker_pipeline, model_name
from .request import GenerateRequest, Job, Limits, max_body_bytes, prepare
from .responses import as_json, png_bytes, png_headers
from .timeouts import BODY_TIMEOUT_S

DEPLOYMENT_NAME = "SSDServer"  # the replicas that hold a pipeline
GATEWAY_NAME = "SSDGateway"  # the ingress
# The gateway's requests at once: each holds a coroutine and at most a body (max_body_bytes: 4 kB for the reference
# model, 100 kB at 4,096 characters a prompt), and every body arrives within body_timeout_s or is refused: slow
# clients would need this many connections opened every body_timeout_s to make the others wait.
GATEWAY_MAX_ONGOING_REQUESTS = 1000

EXAMPLE = '{"prompt": "a red circle"}'  # the smallest request, for the messages that say what to send
SEND_JSON = f"send a JSON object such as {EXAMPLE} with Content-Type: application/json"
JSON_KINDS = {
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}
RETRY = "retry the request, and report the fault if it happens again"


class ErrorAnswer(BaseModel):
    """Every error the API answers, whatever its status: one sentence that says what to change."""

    error: str = Field(description="what was wrong and what to change, in one sentence")


api = FastAPI(
    title="ssd-pipelines",
    description="Text-to-image with Spatially Speculative Decoding, batched on Ray Serve (docs/serving.md).",
    responses={
        "4XX": {"model": ErrorAnswer, "description": "a bad request: what to change"},
        "5XX": {"model": ErrorAnswer, "description": "a fault of the server: retry"},
    },
)


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message}, headers=headers)


class BodyGuard:
    """Reads a request's whole body before the routes run (ASGI middleware of the gateway): HTTP 413 past the
    gateway's `max_body_bytes`, from Content-Length or as the chunks arrive, without holding more than that; 408
    when it has not arrived within `body_timeout_s`. Only then is the request passed on, its body replayed."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not _has_body(scope):
            return await self.app(scope, receive, send)
        gateway = serve.get_replica_context().servable_object  # as Serve's routes find their `self`
        try:
            body = await asyncio.wait_for(_read_body(scope, receive, gateway.limits), gateway.body_timeout_s)
        except _TooLarge as refusal:
            return await _error(413, str(refusal), {"Connection": "close"})(scope, receive, send)
        except TimeoutError:
            message = (
                f"the body did not arrive within {gateway.body_timeout_s:g} s of the request: "
                "send the whole body at once, right after the headers."
            )
            return await _error(408, message, {"Connection": "close"})(scope, receive, send)
        await self.app(scope, _replaying(body, receive), send)


class _TooLarge(Exception):
    pass


def _has_body(scope) -> bool:
    """HTTP/1.1: a request has a body when it says so, with a Content-Length (not 0) or a Transfer-Encoding."""
    headers = dict(scope["headers"])
    return headers.get(b"content-length", b"0") != b"0" or b"transfer-encoding" in headers


async def _read_body(scope, receive, limits: dict) -> bytes:
    limit = limits["max_body_bytes"]
    length = dict(scope["headers"]).get(b"content-length")
    if length is not None and int(length) > limit:
        raise _TooLarge(_too_large(f"its Content-Length says {int(length)} bytes", limits))
    chunks, size = [], 0
    while True:  # a client gone midway ends the body too: its answer, to no one, is the 400 of a cut body
        message = await receive()
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            raise _TooLarge(_too_large(f"more than {limit} bytes arrived", limits))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(sent: str, limits: dict) -> str:
    chars = limits["max_prompt_chars"]
    return (
        f"the body is larger than any request this server reads ({sent}, and the most is "
        f"{limits['max_body_bytes']}: two prompts of {chars} characters and the other fields): "
        f"shorten the prompt and negative_prompt to at most {chars} characters each."
    )


def _replaying(body: bytes, receive):
    """A `receive` that gives the body read, then what the client sends next (its disconnect)."""
    delivered = False

    async def replay():
        nonlocal delivered
        if delivered:
            return await receive()
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


api.add_middleware(BodyGuard)


@api.exception_handler(RequestValidationError)
async def _bad_body(request: Request, error: RequestValidationError) -> JSONResponse:
    """A body that is not a `GenerateRequest` is a bad request (400) too: field by field, or what the body is."""
    return _error(400, "; ".join(_field_error(request, e) for e in error.errors()))


def _field_error(request: Request, error: dict) -> str:
    where, kind = error["loc"][1:], error["type"]  # loc: ("body", field, ...), or ("body", position) for bad JSON
    if kind == "json_invalid":
        return f"the body is not JSON ({error['ctx']['error']} at character {where[0]}): {SEND_JSON}."
    if where:
        return ".".join(map(str, where)) + f": {error['msg']}"
    if kind == "missing":
        return f"the body is empty: {SEND_JSON}."
    if kind == "model_attributes_type" and isinstance(error["input"], bytes):  # FastAPI parses only JSON types
        sent = request.headers.get("content-type", "").split(";")[0].strip()
        return f"the body was sent {f'as {sent}' if sent else 'without a Content-Type'}, not as JSON: {SEND_JSON}."
    if kind == "model_attributes_type":
        return f"the body is {JSON_KINDS[type(error['input'])]}, not a JSON object: send an object such as {EXAMPLE}."
    return f"the body is not a request ({error['msg']}): {SEND_JSON}."


@api.exception_handler(StarletteHTTPException)
async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own refusals (no such route, a wrong method, a body it cannot read), in our shape."""
    return _error(error.status_code, _http_message(request, error), error.headers)


def _http_message(request: Request, error: StarletteHTTPException) -> str:
    path = request.url.path
    if error.status_code == 404:
        return f"there is no {request.method} {path}: use POST /generate, GET /health or GET /info (see GET /docs)."
    if error.status_code == 405:
        allowed = " or ".join(sorted((error.headers or {}).get("Allow", "").split(", ")))
        return f"{request.method} {path} is not allowed: send {allowed} {path}."
    cause = error.__cause__  # FastAPI answers "There was an error parsing the body"; what it caught says why
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start]
        return f"the body is not UTF-8 (byte 0x{byte:02x} at position {cause.start}): encode it in UTF-8."
    if isinstance(cause, RecursionError):
        return f"the body is nested too deeply to be a request: send a flat JSON object such as {EXAMPLE}."
    if cause is not None:
        return f"the body could not be read ({type(cause).__name__}: {cause}): {SEND_JSON}."
    return str(error.detail)


class Unavailable(Exception):
    """No pipeline replica can take the request now: answered 503, to retry."""


@api.exception_handler(Unavailable)
async def _unavailable(request: Request, error: Unavailable) -> JSONResponse:
    return _error(503, str(error))


@api.exception_handler(Exception)
async def _server_fault(request: Request, error: Exception) -> JSONResponse:
    """A fault nothing else caught answers 500 in the same shape, not Starlette's plain text."""
    return _error(500, f"the server failed ({type(error).__name__}: {error}): {RETRY}.")


@serve.deployment(name=DEPLOYMENT_NAME, max_ongoing_requests=16)
class SSDServer:
    """One replica: one pipeline, loaded once; every call's state lives in that call. The gateway calls it."""

    def __init__(
        self,
        model: str | None = None,
        max_batch_size: int = 8,
        batch_wait_timeout_s: float = 0.05,
        threads: int | None = None,
        device: str | None = None,
        dtype: str | None = None,
        max_images_per_request: int = 8,
        exact_max_batch: int | str | None = None,
    ):
        self.model = model_name(model)
        self.pipe = load_worker_pipeline(self.model, device=device, dtype=dtype, threads=threads)
        self.limits = Limits(max_images_per_request=max_images_per_request)
        chars = self.pipe.max_prompt_chars
        self.request_limits = {"max_prompt_chars": chars, "max_body_bytes": max_body_bytes(chars)}
        crossover = None
        if exact_max_batch == "measure":
            crossover = measure(self.pipe, max_batch=max_batch_size).as_dict()
            self.exact_max_batch, source = crossover["exact_max_batch"], "measured at start-up"
            print(f"SSDServer: auto's crossover measured: exact_max_batch={self.exact_max_batch} ({crossover})")
        elif exact_max_batch is None:
            self.exact_max_batch, source = EXACT_MAX_BATCH.default, "the strategy's default"
        else:
            self.exact_max_batch, source = int(exact_max_batch), "given"
        self.option_defaults = {"exact_max_batch": self.exact_max_batch}
        self._decode_batch.set_max_batch_size(max_batch_size)
        self._decode_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self.replica = serve.get_replica_context().replica_tag
        self.serving = {
            "max_batch_size": max_batch_size,
            "batch_wait_timeout_s": batch_wait_timeout_s,
            "max_images_per_request": max_images_per_request,
            "device": str(self.pipe.device),
            "exact_max_batch": self.exact_max_batch,  # auto's, for requests that leave it out
            "exact_max_batch_source": source,
            "crossover": crossover,  # the start-up measurement: seconds per image of exact and ar by batch
        }

    def health(self) -> dict:
        return {"status": "ok", "model": self.model, "replica": self.replica}

    def info(self) -> dict:
        return describe(self.pipe, self.model, self.serving, self.request_limits)

    async def generate(self, body: GenerateRequest) -> Response:
        try:
            job = prepare(self.pipe, body, self.limits, self.option_defaults)
        except ValueError as error:  # the pipeline's own words: what to change
            return _error(400, str(error))
        outcome = await self._decode_batch(job)
        if isinstance(outcome, ValueError):
            return _error(400, str(outcome))
        if isinstance(outcome, Exception):
            return _error(500, f"generation failed ({type(outcome).__name__}: {outcome}): {RETRY}.")
        outcome.stats["serving"]["replica"] = self.replica
        outcome.stats["serving"]["exact_max_batch"] = self.exact_max_batch  # the server's, for auto
        if job.response == "png":
            return Response(png_bytes(outcome.images[0]), media_type="image/png", headers=png_headers(outcome))
        return as_json(outcome)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)  # both set from the constructor's arguments
    async def _decode_batch(self, jobs: list[Job]) -> list[Generated | Exception]:
        """The requests Serve collected; decoded in a thread, so that the replica keeps answering meanwhile."""
        return await asyncio.to_thread(run_batch, self.pipe, jobs)


async def _answer(response: DeploymentResponse):
    """A pipeline replica's answer. A replica that died, or queues that are full, raise `Unavailable`; a fault in
    the replica is raised as itself, for `_server_fault`. (Defined before the gateway: `serve.ingress` freezes the
    app, and the globals its routes use, when the class is defined.)"""
    try:
        return await response
    except RayTaskError as error:
        raise error.cause from None
    except RayActorError:
        raise Unavailable(
            f"the replica drawing this request stopped, and Serve is starting another: {RETRY}."
        ) from None
    except BackPressureError as error:
        raise Unavailable(
            f"every replica is busy and its queue full ({error.message}): retry the request later."
        ) from None


@serve.deployment(
    name=GATEWAY_NAME, max_ongoing_requests=GATEWAY_MAX_ONGOING_REQUESTS, ray_actor_options={"num_cpus": 0}
)
@serve.ingress(api)
class SSDGateway:
    """The HTTP API: every request's body read whole (`BodyGuard`), then passed to a pipeline replica."""

    async def __init__(self, server: DeploymentHandle, body_timeout_s: float = BODY_TIMEOUT_S):
        self.server = server
        self.body_timeout_s = body_timeout_s
        self.limits = (await server.info.remote())["limits"]  # the model's, for BodyGuard

    @api.get("/health")
    async def health(self) -> dict:
        return await _answer(self.server.health.remote())

    @api.get("/info")
    async def info(self) -> dict:
        info = await _answer(self.server.info.remote())
        info["limits"]["body_timeout_s"] = self.body_timeout_s
        return info

    @api.post(
        "/generate",
        responses={
            200: {"content": {"image/png": {}}, "description": "the image (png) or images, codes and stats (json)"},
            400: {"model": ErrorAnswer, "description": "a bad request, with the pipeline's message"},
            408: {"model": ErrorAnswer, "description": "the body did not arrive within body_timeout_s"},
            413: {"model": ErrorAnswer, "description": "the body is larger than any request the model reads"},
        },
    )
    async def generate(self, body: GenerateRequest):
        return await _answer(self.server.generate.remote(body))


def build_app(
    model: str | None = None,
    *,
    num_replicas: int | str | None = None,
    ray_actor_options: dict | None = None,
    autoscaling_config: dict | None = None,
    max_batch_size: int = 8,
    batch_wait_timeout_s: float = 0.05,
    threads: int | None = None,
    device: str | None = None,
    dtype: str | None = None,
    max_images_per_request: int = 8,
    max_ongoing_requests: int | None = None,
    max_queued_requests: int | None = None,
    exact_max_batch: int | str | None = None,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> Application:
    """The application `serve.run` takes: the gateway, and `num_replicas` replicas (default 1; or
    `autoscaling_config`, passed to Serve as it is), each holding the pipeline of `model` (default: the reference
    model, offline) with `ray_actor_options` (default: one CPU per torch thread). A replica takes up to
    `max_ongoing_requests` requests at once (default: twice `max_batch_size`, so that one batch fills while another
    decodes); beyond `max_queued_requests` waiting, the gateway answers 503. `exact_max_batch`: `auto`'s crossover
    for requests that leave it out: an int, "measure" (each replica times exact against ar at start-up, about half
    a minute on a CPU), or None (the default, 1). A body that has not arrived `body_timeout_s` after the gateway
    took its request is refused (408)."""
    if max_batch_size < 1 or batch_wait_timeout_s < 0:
        raise ValueError(
            f"max_batch_size must be >= 1 and batch_wait_timeout_s >= 0, got {max_batch_size}, {batch_wait_timeout_s}."
        )
    if max_images_per_request < 1:
        raise ValueError(f"max_images_per_request must be >= 1, got {max_images_per_request}.")
    if exact_max_batch not in (None, "measure") and (
        isinstance(exact_max_batch, bool) or not isinstance(exact_max_batch, int) or exact_max_batch < 0
    ):
        raise ValueError(f"exact_max_batch must be an int >= 0, 'measure' or None, got {exact_max_batch!r}.")
    if not body_timeout_s > 0:
        raise ValueError(f"body_timeout_s must be > 0, got {body_timeout_s}.")
    options = {
        "ray_actor_options": ray_actor_options or {"num_cpus": threads or 1},
        "max_ongoing_requests": max_ongoing_requests or 2 * max_batch_size,
    }
    if autoscaling_config is not None:
        if num_replicas not in (None, "auto"):
            raise ValueError(
                "pass num_replicas or autoscaling_config, not both: Serve scales an autoscaled "
                "deployment between its min_replicas and max_replicas."
            )
        options["autoscaling_config"] = autoscaling_config
    else:
        options["num_replicas"] = num_replicas or 1
    if max_queued_requests is not None:
        options["max_queued_requests"] = max_queued_requests
    server = SSDServer.options(**options).bind(
        model=model_name(model),
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=batch_wait_timeout_s,
        threads=threads,
        device=device,
        dtype=dtype,
        max_images_per_request=max_images_per_request,
        exact_max_batch=exact_max_batch,
    )
    return SSDGateway.bind(server, body_timeout_s=body_timeout_s)
