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
