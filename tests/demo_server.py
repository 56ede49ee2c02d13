"""The demo served by `python -m app` in a subprocess on a free loopback port, for the browser, API and load tests.

The `demo_server` fixture starts one server for the whole session (concurrency 2, so
concurrent generations are tested too); `start_demo` starts others with their own flags.
The server finds its port in GRADIO_SERVER_PORT, as any Gradio app does.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from gradio_client import Client

STARTUP_SECONDS = 180  # torch, gradio and the model load on a busy two-core machine


@dataclass
class DemoServer:
    url: str
    process: subprocess.Popen
    log: Path

    def rss(self) -> int:
        """Resident memory of the server process, in bytes."""
        return psutil.Process(self.process.pid).memory_info().rss

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_demo(workdir: Path, *args: str, flag_port: int | None = None) -> DemoServer:
    """Start the demo with `args` and return once its page answers. It listens on GRADIO_SERVER_PORT (a free
    port), or on `flag_port` given as --server-port, which must win over the environment."""
    port = free_port()
    env = os.environ | {
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(port),
        "GRADIO_ANALYTICS_ENABLED": "False",
        "GRADIO_TEMP_DIR": str(workdir / "gradio"),
        "HF_HUB_OFFLINE": "1",
    }
    if flag_port is not None:
        args, port = (*args, "--server-port", str(flag_port)), flag_port
    log = workdir / "server.log"
    with log.open("w") as out:
        # cwd: the work folder, so that the server imports the installed packages and writes nothing in the repo
        process = subprocess.Popen(
            [sys.executable, "-m", "app", *args], cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    server = DemoServer(f"http://127.0.0.1:{port}/", process, log)
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the demo exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(server.url, timeout=5) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass  # not listening yet
        time.sleep(0.25)  # poll the condition: the page answers
    server.stop()
    raise RuntimeError(f"the demo did not answer within {STARTUP_SECONDS} s:\n{log.read_text()[-4000:]}")


def named(client: Client, result: tuple) -> dict:
    """The outputs of the `/generate` endpoint by their labels."""
    returns = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["returns"]
    return {r["label"]: value for r, value in zip(returns, result, strict=True)}


@pytest.fixture(scope="session")
def demo_server(tmp_path_factory):
    server = start_demo(tmp_path_factory.mktemp("demo"), "--concurrency", "2")
    yield server
    server.stop()
