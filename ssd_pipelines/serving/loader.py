"""Loading the pipeline a worker (a Serve replica, a bulk actor) holds: its model, device, dtype and threads."""

from __future__ import annotations

from pathlib import Path

import torch

from ..hub import default_model
from ..precisions import default_precision


def model_name(model: str | None) -> str:
    """The model to load: a local folder made absolute (workers start in other folders), a Hub name as it is;
    None is the reference model, the bundled copy first (offline)."""
    model = model or default_model()
    path = Path(model).expanduser()
    return str(path.resolve()) if path.exists() else model


def load_worker_pipeline(model: str | None, device: str | None = None, dtype: str | None = None, threads=None):
    """The pipeline on `device` (default: the GPU Ray gave this worker, else the CPU), in the precision `dtype`
    names (`precisions.py`; default: float32 on the CPU, where it is faster, else float16), with `threads` torch
    threads (default 1 on the CPU: fastest for small models and on a shared machine)."""
    from ..pipeline_ssd import SSDAutoregressivePipeline
    from ..quantization import precision_options

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if threads or device == "cpu":
        torch.set_num_threads(threads or 1)
    options = precision_options(dtype or default_precision(torch.device(device).type), device)
    pipe = SSDAutoregressivePipeline.from_pretrained(model_name(model), **options)
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)
