"""`ssd-serve`: serve a pipeline over HTTP on Ray Serve, concurrent requests batched, until Ctrl-C.

ssd-serve                                                    # the reference model on http://127.0.0.1:8000
ssd-serve --model hub_cards/ssd-reference --replicas 2 --max-batch-size 8 --port 8000
ssd-serve --address auto --host 0.0.0.0                      # join a running Ray cluster
ssd-serve --autoscaling '{"min_replicas": 1, "max_replicas": 4}'
ssd-serve --exact-max-batch measure                          # auto's crossover timed by each replica at start-up

Without --address it starts a local Ray with this machine's CPUs (and GPUs) and stops it on exit; with --address
it joins that cluster and on exit deletes only its own application. docs/serving.md describes the HTTP API.
A body must arrive within --body-timeout-s of its request (else 408), and a connection idle for
--keep-alive-timeout-s, before its first request as between requests, is closed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

from ..precisions import add_dtype_argument, check_precision, default_precision
from .timeouts import BODY_TIMEOUT_S, KEEP_ALIVE_TIMEOUT_S

APP_NAME = "ssd"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ssd-serve", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default=None,
        help="pipeline folder or Hub repository (default: the reference model, the bundled copy first: offline)",
    )
    parser.add_argument("--replicas", type=int, default=None, help="replicas, each holding one pipeline (default 1)")
    parser.add_argument(
        "--autoscaling",
        type=json.loads,
        default=None,
        metavar="JSON",
        help="Serve's autoscaling_config as JSON, passed as it is (instead of --replicas)",
    )
    parser.add_argument("--max-batch-size", type=int, default=8, help="requests batched into one replica's work")
    parser.add_argument(
        "--batch-wait-timeout-s",
        type=float,
        default=0.05,
        help="how long a batch waits to fill before it decodes (default 0.05)",
    )
    parser.add_argument("--max-images", type=int, default=8, help="the most images one request may ask for")
    parser.add_argument(
        "--max-ongoing-requests", type=int, default=None, help="requests a replica takes at once (default: 2 x batch)"
    )
    parser.add_argument(
        "--max-queued-requests",
        type=int,
        default=None,
        help="requests that may wait; beyond, HTTP 503 (default: no cap)",
    )
    parser.add_argument(
        "--exact-max-batch",
        type=_exact_max_batch,
        default=None,
        metavar="N|measure",
        help="auto's crossover for requests that leave it out: the largest call decoded with exact, larger ones "
        "with ar; 'measure': each replica times exact against ar at start-up (~30 s on a CPU); default 1",
    )
    parser.add_argument(
        "--body-timeout-s",
        type=float,
        default=BODY_TIMEOUT_S,
        help=f"seconds a request's body may take to arrive; a slower one gets HTTP 408 (default {BODY_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--keep-alive-timeout-s",
        type=int,
        default=KEEP_ALIVE_TIMEOUT_S,
        help="seconds a connection may stay idle, before its first request or between requests, before the server "
        f"closes it (default {KEEP_ALIVE_TIMEOUT_S}, Serve's own)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica (default 1)")
    parser.add_argument(
        "--cpus-per-replica", type=float, default=None, help="Ray CPUs per replica (default: --threads)"
    )
    parser.add_argument("--gpus-per-replica", type=float, default=0, help="Ray GPUs per replica (default 0: the CPU)")
    add_dtype_argument(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--address", default=None, help="a Ray cluster to join ('auto': the one on this machine); default: start one"
    )
    parser.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs of the local Ray started without --address (default: all)"
    )
    args = parser.parse_args(argv)
    if args.replicas is not None and args.autoscaling is not None:
        parser.error("pass --replicas or --autoscaling, not both")
    at_least_one = ("replicas", "max_batch_size", "max_images", "threads", "max_ongoing_requests", "num_cpus")
    for name in (*at_least_one, "keep_alive_timeout_s"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    if args.batch_wait_timeout_s < 0:
        parser.error(f"--batch-wait-timeout-s must be >= 0, got {args.batch_wait_timeout_s}")
    if not args.body_timeout_s > 0:
        parser.error(f"--body-timeout-s must be > 0, got {args.body_timeout_s}")
    replica_device = "cuda" if args.gpus_per_replica else "cpu"
    args.dtype = args.dtype or default_precision(replica_device)
    try:
        check_precision(args.dtype, replica_device)
    except ValueError as error:
        parser.error(str(error))
    return args


def _exact_max_batch(value: str) -> int | str:
    if value == "measure":
        return value
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"an int >= 0 or 'measure', got {value!r}") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"an int >= 0 or 'measure', got {value!r}")
    return number


def build(args: argparse.Namespace):
    from .deployment import build_app

    actor_options = {"num_cpus": args.threads if args.cpus_per_replica is None else args.cpus_per_replica}
    if args.gpus_per_replica:
        actor_options["num_gpus"] = args.gpus_per_replica
    return build_app(
        args.model,
        num_replicas=args.replicas,
        autoscaling_config=args.autoscaling,
        ray_actor_options=actor_options,
        max_batch_size=args.max_batch_size,
        batch_wait_timeout_s=args.batch_wait_timeout_s,
        threads=args.threads,
        dtype=args.dtype,
        max_images_per_request=args.max_images,
        max_ongoing_requests=args.max_ongoing_requests,
        max_queued_requests=args.max_queued_requests,
        exact_max_batch=args.exact_max_batch,
        body_timeout_s=args.body_timeout_s,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import ray
    from ray import serve

    from . import timeouts

    try:
        app = build(args)
    except ValueError as error:
        print(f"ssd-serve: error: {error}", file=sys.stderr)
        return 2
    if args.address:
        ray.init(address=args.address)
    else:
        ray.init(num_cpus=args.num_cpus or os.cpu_count(), include_dashboard=False)
    signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops it as Ctrl-C does: replicas and Ray shut down
    try:
        timeouts.start(args.host, args.port, args.keep_alive_timeout_s)
        serve.run(app, name=APP_NAME, route_prefix="/")
        print(
            f"ssd-serve: serving on http://{args.host}:{args.port} (POST /generate, GET /info); Ctrl-C stops",
            flush=True,
        )
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("ssd-serve: stopping", file=sys.stderr)
    finally:
        # Not serve.shutdown(): it waits on the controller's graceful_shutdown task until the controller kills
        # itself, and Ray, which retries the controller's tasks for ever, logs that task as failed at every stop.
        serve.delete(APP_NAME)  # our replicas finish their requests and stop; a cluster joined keeps the rest
        ray.shutdown()  # the local Ray started without --address stops, and Serve with it
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
