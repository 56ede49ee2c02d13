"""Stand-in for `comfy/model_management.py`: the device ComfyUI picks and its interrupt flag.

`throw_exception_if_processing_interrupted` raises and clears the flag, as ComfyUI's does; the server sets the
flag on POST /interrupt (the Cancel button).
"""

from __future__ import annotations

import threading

import torch

_lock = threading.RLock()
interrupt_processing = False


class InterruptProcessingException(Exception):
    pass


def get_torch_device() -> torch.device:
    return torch.device("cpu")  # what ComfyUI returns under --cpu, as CI runs


def interrupt_current_processing(value: bool = True) -> None:
    global interrupt_processing
    with _lock:
        interrupt_processing = value


def processing_interrupted() -> bool:
    with _lock:
        return interrupt_processing


def throw_exception_if_processing_interrupted() -> None:
    global interrupt_processing
    with _lock:
        if interrupt_processing:
            interrupt_processing = False
            raise InterruptProcessingException()
