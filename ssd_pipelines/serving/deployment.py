"""The Ray Serve deployment: one pipeline per replica, concurrent requests batched, behind an HTTP API (FastAPI).

    POST /generate   a `GenerateRequest` (JSON) -> the PNG (response="png") or JSON with base64 PNGs, codes, stats
    GET  /health     this replica is up, with its pipeline loaded
    GET  /info       the model, its image sizes, the decodings with their options, defaults and lossless flags,
                     and the serving settings (`exact_max_batch`: auto's crossover, given or measured at start-up)

A request is validated on arrival (`request.prepare`: the pipeline's own checks; HTTP 400 with its message),
then waits for `@serve.batch` to collect it with others (up to `max_batch_size`, at most `batch_wait_timeout_s`),
and the batch runs in a worker thread (`batching.run_batch`: one pipeline call per group of identical options).
Each answer's `stats["serving"]` says what batch it ran in and how long it queued and decoded.
With `exact_max_batch="measure"` each replica times `exact` against `ar` once at start-up (serving/crossover.py)
and uses the crossover for the `auto` requests that leave `exact_max_batch` out; an int is used as given.
`build_app(...)` makes the application; `ssd-serve` (serving/cli.py) runs it.
"""

# No `from __future__ import annotations`: FastAPI reads the body model off `generate`'s annotation, and with it
# (a string) FastAPI under Serve's ingress took the body for a required query parameter and refused every request.
import asyncio

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from ray import serve
from ray.serve.deployment import Application

from ..decoding.options import EXACT_MAX_BATCH
from .batching import Generated, run_batch
from .crossover import measure
from .info import describe
from .loader import load_worker_pipeline, model_name
from .request import GenerateRequest, Job, Limits, prepare
from .responses import as_json, png_bytes, png_headers

DEPLOYMENT_NAME = "SSDServer"

api = FastAPI(
    title="ssd-pipelines",
    description="Text-to-image with Spatially Speculative Decoding, batched on Ray Serve (docs/serving.md).",
)


@api.exception_handler(RequestValidationError)
async def _bad_body(request, error: RequestValidationError) -> JSONResponse:
    """A body that is not a `GenerateRequest` is a bad request (400) too, said field by field."""
    return _error(400, "; ".join(map(_field_error, error.errors())))


def _field_error(error: dict) -> str:
    if error["type"] == "json_invalid":
        return f"the body is not JSON ({error.get('ctx', {}).get('error', error['msg'])}): send a JSON object"
    field = ".".join(str(part) for part in error["loc"] if part != "body") or "body"
    return f"{field}: {error['msg']}"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": message})


@serve.deployment(name=DEPLOYMENT_NAME, max_ongoing_requests=16)
@serve.ingress(api)
class SSDServer:
    """One replica: one pipeline, loaded once; every call's state lives in that call."""

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

    @api.get("/health")
    async def health(self) -> dict:
        return {"status": "ok", "model": self.model, "replica": self.replica}

    @api.get("/info")
    async def info(self) -> dict:
        return describe(self.pipe, self.model, self.serving)

    @api.post(
        "/generate",
        responses={
            200: {"content": {"image/png": {}}, "description": "the image (png) or images, codes and stats (json)"},
            400: {"description": "a bad request, with the pipeline's message"},
        },
    )
    async def generate(self, body: GenerateRequest):
        try:
            job = prepare(self.pipe, body, self.limits, self.option_defaults)
        except ValueError as error:  # the pipeline's own words: what to change
            return _error(400, str(error))
        outcome = await self._decode_batch(job)
        if isinstance(outcome, ValueError):
            return _error(400, str(outcome))
        if isinstance(outcome, Exception):
            return _error(500, f"generation failed: {type(outcome).__name__}: {outcome}")
        outcome.stats["serving"]["replica"] = self.replica
        outcome.stats["serving"]["exact_max_batch"] = self.exact_max_batch  # the server's, for auto
        if job.response == "png":
            return Response(png_bytes(outcome.images[0]), media_type="image/png", headers=png_headers(outcome))
        return as_json(outcome)

    @serve.batch(max_batch_size=8, batch_wait_timeout_s=0.05)  # both set from the constructor's arguments
    async def _decode_batch(self, jobs: list[Job]) -> list[Generated | Exception]:
        """The requests Serve collected; decoded in a thread, so that the replica keeps answering meanwhile."""
        return await asyncio.to_thread(run_batch, self.pipe, jobs)


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
) -> Application:
    """The application `serve.run` takes: `num_replicas` replicas (default 1; or `autoscaling_config`, passed
    to Serve as it is), each holding the pipeline of `model` (default: the reference model, offline) with `ray_actor_options`
    (default: one CPU per torch thread). A replica takes up to `max_ongoing_requests` requests at once (default:
    twice `max_batch_size`, so that one batch fills while another decodes); beyond `max_queued_requests` waiting,
    Serve answers 503. `exact_max_batch`: `auto`'s crossover for requests that leave it out: an int, "measure"
    (each replica times exact against ar at start-up, about half a minute on a CPU), or None (the default, 3)."""
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
    return SSDServer.options(**options).bind(
        model=model_name(model),
        max_batch_size=max_batch_size,
        batch_wait_timeout_s=batch_wait_timeout_s,
        threads=threads,
        device=device,
        dtype=dtype,
        max_images_per_request=max_images_per_request,
        exact_max_batch=exact_max_batch,
    )
