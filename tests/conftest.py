"""Shared test settings: ROS traffic stays on this machine, one thread per ONNX session, the
backend choices (decoding.backend_choice) in a cache of this run's own, never the user's."""
import atexit
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")
if "SOL_CONTROL_CACHE_DIR" not in os.environ:
    os.environ["SOL_CONTROL_CACHE_DIR"] = tempfile.mkdtemp(prefix="sol_control_test_cache_")
    atexit.register(shutil.rmtree, os.environ["SOL_CONTROL_CACHE_DIR"], True)

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
MODELS = REPO / "models"


def bundle_dir(task: str) -> Path | None:
    """The bundle under test: $SOL_CONTROL_TEST_BUNDLES/<task>, else the shipped models/<task>."""
    alt = os.environ.get("SOL_CONTROL_TEST_BUNDLES")
    for d in ([Path(alt) / task] if alt else []) + [MODELS / task]:
        if (d / "manifest.json").is_file():
            return d
    return None


# -- markers: what a test starts (setup.cfg [tool:pytest] registers them) ----------------------------
# `make test` runs every test; `make test-quick` deselects these three. A test that starts one of
# them without its marker fails here, so the quick run never starts a process, a DDS participant or
# the simulator by accident.
_CURRENT: list = []  # the test being run (setup, call and teardown, module fixtures included)


def _guard(marker: str, what: str):
    def check(args: tuple) -> None:
        if _CURRENT and _CURRENT[-1].get_closest_marker(marker) is None:
            import pytest

            detail = repr(args[1])[:120] if what == "starts a process" and len(args) > 1 else ""
            pytest.fail(f"{_CURRENT[-1].nodeid} {what} {detail}: mark it @pytest.mark.{marker}", pytrace=False)
    return check


def _wrap(owner, name: str, check, static: bool = False) -> None:
    original = getattr(owner, name)

    def wrapped(*args, **kwargs):
        check(args)
        return original(*args, **kwargs)
    setattr(owner, name, staticmethod(wrapped) if static else wrapped)


def pytest_configure(config) -> None:
    import multiprocessing.process
    import subprocess

    import mujoco
    import rclpy

    _wrap(subprocess.Popen, "__init__", _guard("process", "starts a process"))
    _wrap(multiprocessing.process.BaseProcess, "start", _guard("process", "starts a process"))
    _wrap(rclpy, "init", _guard("ros", "creates a DDS participant (rclpy.init)"))
    for name in ("from_xml_string", "from_xml_path"):
        _wrap(mujoco.MjModel, name, _guard("sim", "builds a MuJoCo model"), static=True)


def pytest_runtest_protocol(item, nextitem):
    _CURRENT.append(item)


def pytest_runtest_logfinish(nodeid, location):
    _CURRENT.clear()
