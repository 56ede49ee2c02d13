"""`ssd-demo` (or `python -m app`): load a pipeline once and serve the demo page.

ssd-demo                                     # the reference model, on http://127.0.0.1:7860
ssd-demo --model me/my-pipeline --device cuda
GRADIO_SERVER_NAME=0.0.0.0 GRADIO_SERVER_PORT=8000 ssd-demo
"""

from __future__ import annotations

import argparse
import sys

from ssd_pipelines.devices import DEFAULT_HELP, check_device, device_type
from ssd_pipelines.precisions import add_dtype_argument, check_precision, default_precision


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ssd-demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default=None,
        help="pipeline folder or repository, or a heads repository naming its base model "
        "(default: the reference model, the bundled copy first)",
    )
    parser.add_argument("--heads", default=None, help="drafting heads (folder or repository) to use instead")
    parser.add_argument(
        "--device", default=None, help=f"torch device, e.g. cpu, cuda, cuda:1 (default: {DEFAULT_HELP})"
    )
    add_dtype_argument(parser)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads for torch (default on CPU: 1, fastest for the small reference model)",
    )
    parser.add_argument(
        "--server-name", default=None, help="address to listen on (default: $GRADIO_SERVER_NAME, else 127.0.0.1)"
    )
    parser.add_argument(
        "--server-port",
        type=int,
        default=None,
        help="port (default: $GRADIO_SERVER_PORT, else 7860 or the next free one)",
    )
    parser.add_argument(
        "--share",
        action="store_true",
        help="also serve on a public gradio.live link; this needs Gradio's share servers on the internet, "
        "so it does not work offline",
    )
    parser.add_argument(
        "--concurrency", type=int, default=1, help="generations run at once (each on the same loaded model)"
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=16,
        help="requests that may wait; beyond that a request is refused as queue full",
    )
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.max_queue < 1:
        parser.error("--concurrency and --max-queue must be >= 1")
    try:
        args.device = check_device(args.device)
        args.dtype = args.dtype or default_precision(device_type(args.device))
        check_precision(args.dtype, device_type(args.device))
    except ValueError as error:
        parser.error(str(error))
    return args


def load_pipeline(args: argparse.Namespace):
    """The pipeline the whole server shares, on its device and dtype."""
    from ssd_pipelines import SSDAutoregressivePipeline
    from ssd_pipelines.hub import default_model
    from ssd_pipelines.quantization import precision_options

    options = precision_options(args.dtype, args.device)
    pipe = SSDAutoregressivePipeline.from_pretrained(args.model or default_model(), heads=args.heads, **options)
    pipe.set_progress_bar_config(disable=True)  # the page shows the progress
    return pipe.to(args.device)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from .ui import CSS, JS, build_demo

    if args.threads or args.device == "cpu":
        torch.set_num_threads(args.threads or 1)

    try:
        pipe = load_pipeline(args)
    except ValueError as error:  # the library's message says what to pass instead
        print(f"ssd-demo: {error}", file=sys.stderr)
        return 2
    demo = build_demo(pipe, args.model or "ssd-reference, the reference model")
    demo.queue(default_concurrency_limit=args.concurrency, max_size=args.max_queue)
    demo.launch(
        server_name=args.server_name,  # None: Gradio reads GRADIO_SERVER_NAME
        server_port=args.server_port,  # None: Gradio reads GRADIO_SERVER_PORT
        share=args.share or None,  # None: Gradio reads GRADIO_SHARE
        css=CSS,
        js=JS,
    )
    return 0
