"""The `ray_cluster` fixture: a local Ray that the test session starts itself, and stops at its end.

Two CPUs (this project's CI machine has two), no dashboard, Ray's files in a temporary folder of its own (short:
Ray's socket paths must fit in 107 characters), RAY_ADDRESS ignored, so that it never joins nor stops a Ray it
did not start. Ray puts its node on the machine's address (it refuses loopback on Linux); the HTTP servers the
tests start listen on 127.0.0.1 only. Without ray installed the serving tests are skipped, except in CI (CI=true),
where that fails them: CI installs `.[test]`, which brings `ray[serve,data]`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass

import pytest


def require_ray() -> None:
    try:
        import ray
        import ray.data  # noqa: F401
        from ray import serve  # noqa: F401
    except ImportError as error:
        message = f"ray[serve,data] is not installed ({error}): pip install -e '.[serve]'"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)


@dataclass(frozen=True)
class RayCluster:
    address: str  # for a driver in a subprocess: ray.init(address=...)
    temp_dir: str


@pytest.fixture(scope="session")
def ray_cluster():
    require_ray()
    import ray

    if ray.is_initialized():
        pytest.fail("this process is already connected to a Ray: the serving tests start their own")
    saved = os.environ.pop("RAY_ADDRESS", None)
    temp_dir = tempfile.mkdtemp(prefix="ssd-ray-")
    try:
        context = ray.init(
            num_cpus=2,
            include_dashboard=False,
            _temp_dir=temp_dir,
            object_store_memory=256 * 1024**2,
            namespace="ssd-pipelines-tests",
            log_to_driver=False,  # the replicas' logs stay in temp_dir/session_latest/logs
        )
        assert context.address_info["session_dir"].startswith(temp_dir), "not the Ray this fixture started"
        yield RayCluster(address=context.address_info["address"], temp_dir=temp_dir)
    finally:
        ray.shutdown()
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved
        shutil.rmtree(temp_dir, ignore_errors=True)
