"""A new bundle onto a running line, without a restart (ros.bundle_swap, TaskRunner.at_boundary).

Over real rclpy + Fast DDS (shipped profile, localhost, ROS_DOMAIN_ID 66): the node runs in this
process (tests.ros_helpers.Harness); a `Line` node with its own executor thread publishes frames in
lock-step, records every verdict and /diagnostics, and asks for bundles through the node's
set_parameters service, as `ros2 param set` does. Its own executor keeps it listening while the
node's executor is busy loading a bundle. Timing is never asserted: the load is held open by an
event while frames are decided, and every wait is a condition.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from sol_control.audit import DecidingGate
from sol_control.budget import ManualClock
from sol_control.config import from_flat
from sol_control.decision import Decision, Failure, safe_decision
from sol_control.runner import CountingHooks, TaskRunner
from sol_control.telemetry import Frame, Telemetry
from tests.conftest import bundle_dir
from tests.ros_helpers import Harness, now_ns, spin_until_shutdown, wait_for

DOMAIN = 66
QC_BUNDLE, GRASP_BUNDLE = bundle_dir("qc"), bundle_dir("grasp")
assert QC_BUNDLE is not None and GRASP_BUNDLE is not None, "the shipped bundles are part of the repository"
PARAMS = {"mode": "qc", "qc.bundle": str(QC_BUNDLE), "decoding.warmup_runs": 2, "audit_rate": 0.0,
          "deadline.qc_ms": 300.0, "deadline.max_staleness_ms": 1000.0, "deadline.output_deadline_ms": 300.0,
          "deadline.sensor_timeout_ms": 60000.0}
LOAD_S = 180.0  # a bundle's verify + sessions + warm-up on a loaded 2-core machine, generously


def manifest_sha(bundle: Path) -> str:
    return hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()


def copy_bundle(src: Path, dst: Path, description: str | None = None) -> Path:
    """A copy of `src`; with `description`, its manifest says so (the same models, a new sha256)."""
    shutil.copytree(src, dst)
    if description is not None:
        manifest = json.loads((dst / "manifest.json").read_text())
        (dst / "manifest.json").write_text(json.dumps({**manifest, "description": description}, indent=2))
    return dst


def kv(status) -> dict[str, str]:
    return {v.key: v.value for v in status.values}


class Line:
    """The user's side of the line, spun by its own executor thread."""

    def __init__(self, h: Harness):
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
        from rcl_interfaces.srv import SetParameters
        from rclpy.executors import SingleThreadedExecutor
        from sensor_msgs.msg import Image

        self.h = h
        self.node = rclpy.create_node("sol_control_swap_line", context=h.ctx)
        self.lock = threading.Lock()
        self.verdicts: list[dict[str, str]] = []
        self.diagnostics: list = []
        self.sent: list[int] = []
        self.images = self.node.create_publisher(Image, "camera/image_raw", 10)
        self.node.create_subscription(DiagnosticStatus, "qc/verdict", lambda m: self._add(self.verdicts, kv(m)), 100)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: self._add(self.diagnostics, m), 10)
        self.params = self.node.create_client(SetParameters, "/sol_control/set_parameters")
        self.executor = SingleThreadedExecutor(context=h.ctx)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=spin_until_shutdown, args=(self.executor, h.ctx), daemon=True)
        self._thread.start()
        assert wait_for(lambda: self.images.get_subscription_count() > 0 and self.params.service_is_ready(), 10.0)

    def _add(self, into: list, item) -> None:
        with self.lock:
            into.append(item)

    def send(self, i: int = 0) -> int:
        """Publish test scene `i` as a new frame; its stamp."""
        from sol_control.ros.convert import image_to_ros
        from sol_control.tasks.qc import make_sample

        stamp = now_ns(self.node)
        self.sent.append(stamp)
        self.images.publish(image_to_ros(make_sample("test", i).image, stamp, "qc_camera"))
        return stamp

    def wait_verdict(self, stamp: int) -> dict[str, str]:
        assert wait_for(lambda: self.verdict(stamp), 20.0), f"no verdict for frame {stamp}"
        return self.verdict(stamp)

    def decide(self, i: int = 0) -> dict[str, str]:
        """Publish one frame and wait for its verdict (lock-step)."""
        return self.wait_verdict(self.send(i))

    def verdict(self, stamp: int) -> dict[str, str] | None:
        with self.lock:
            return next((v for v in self.verdicts if v["stamp"] == str(stamp)), None)

    def set_bundle_async(self, path: Path | str):
        from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
        from rcl_interfaces.srv import SetParameters

        value = ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=str(path))
        return self.params.call_async(SetParameters.Request(parameters=[Parameter(name="qc.bundle", value=value)]))

    def set_bundle(self, path: Path | str):
        future = self.set_bundle_async(path)
        assert wait_for(future.done, LOAD_S), "no answer from set_parameters"
        return future.result().results[0]

    def qc_status(self) -> dict[str, str]:
        with self.lock:
            last = self.diagnostics[-1] if self.diagnostics else None
        return next((kv(s) for s in last.status if s.name == "sol_control: qc"), {}) if last else {}

    def close(self) -> None:
        self._thread.join(timeout=5.0)
        self.executor.shutdown()
        self.node.destroy_node()


@pytest.fixture(scope="module")
def line():
    h = Harness(DOMAIN, PARAMS)
    ln = Line(h)
    yield ln
    h.close()
    ln.close()


@pytest.fixture
def held_load(monkeypatch):
    """Coprocessor.load_pipeline loads for real, then waits for `release` before it returns: the new
    pipeline exists beside the running one for as long as the test wants."""
    from sol_control.coprocessor import Coprocessor

    loaded, release = threading.Event(), threading.Event()
    real = Coprocessor.load_pipeline

    def load_then_wait(self, task, bundle):
        p = real(self, task, bundle)
        loaded.set()
        assert release.wait(LOAD_S)
        return p
    monkeypatch.setattr(Coprocessor, "load_pipeline", load_then_wait)
    yield loaded, release
    release.set()


# -- over DDS ---------------------------------------------------------------------------------------
@pytest.mark.ros
def test_a_swap_in_a_lock_step_run_loses_no_decision(line, held_load, tmp_path):
    loaded, release = held_load
    old_sha = manifest_sha(QC_BUNDLE)
    new = copy_bundle(QC_BUNDLE, tmp_path / "qc_v2", "the shipped QC models, swapped in at run time")
    new_sha = manifest_sha(new)
    assert new_sha != old_sha
    before = [line.decide(i) for i in range(3)]
    future = line.set_bundle_async(new)
    assert wait_for(loaded.is_set, LOAD_S), "the new bundle never finished loading"
    during = [line.decide(i) for i in range(3, 8)]  # the new pipeline exists; the old one decides
    assert not future.done()
    in_flight = line.send(8)  # the swap lands before, during or after this frame's decision
    release.set()
    assert wait_for(future.done, LOAD_S) and future.result().results[0].successful, future.result()
    across = line.wait_verdict(in_flight)
    after = [line.decide(i) for i in range(9, 12)]

    assert [v["bundle_sha256"] for v in before + during] == [old_sha] * 8
    assert across["bundle_sha256"] in (old_sha, new_sha)  # made by one bundle, whole
    assert [v["bundle_sha256"] for v in after] == [new_sha] * 3
    with line.lock:
        stamps = [int(v["stamp"]) for v in line.verdicts]
    assert sorted(stamps) == sorted(line.sent), "every frame sent got exactly one decision"
    assert wait_for(lambda: line.qc_status().get("bundle_sha256") == new_sha, 10.0), line.qc_status()
    st = line.qc_status()
    assert st["bundle"] == str(new.resolve()) and st["bundle_swaps"] == "1", st


@pytest.mark.ros
@pytest.mark.parametrize("case, reason", [
    ("flipped_byte", "sha256 mismatch for 'target_fused_int8.onnx'"),
    ("bad_manifest", "invalid manifest.json"),
    ("grasp_bundle", "holds a 'grasp' model, not qc"),
    ("no_folder", "no manifest.json"),
])
def test_a_bad_bundle_is_refused_and_the_old_one_keeps_deciding(line, tmp_path, case, reason):
    running = line.decide(0)["bundle_sha256"]
    param_before = _qc_bundle_param(line)
    refused = line.h.node.bundle_swaps.refused["qc"] + 1
    bad = _bad_bundle(case, tmp_path)
    result = line.set_bundle(bad)
    assert not result.successful and reason in result.reason, result.reason
    assert "keeps deciding on " + running[:12] in result.reason
    assert _qc_bundle_param(line) == param_before  # the parameter kept its value
    assert [line.decide(i)["bundle_sha256"] for i in range(1, 4)] == [running] * 3
    assert wait_for(lambda: line.qc_status().get("bundle_swaps_refused") == str(refused), 10.0), line.qc_status()
    assert reason in line.qc_status()["bundle_swap_last_refusal"]


@pytest.mark.ros
def test_a_bundle_whose_warm_up_fails_is_refused(line, tmp_path, monkeypatch):
    from sol_control.coprocessor import Coprocessor

    def broken(self, p, runs):
        raise RuntimeError("session lost in warm-up")
    monkeypatch.setattr(Coprocessor, "_warm", broken)
    running = line.decide(0)["bundle_sha256"]
    good = copy_bundle(QC_BUNDLE, tmp_path / "qc_good", "a good bundle whose warm-up fails")
    result = line.set_bundle(good)
    assert not result.successful and "warm-up failed: RuntimeError: session lost in warm-up" in result.reason
    assert line.decide(1)["bundle_sha256"] == running


@pytest.mark.ros
def test_setting_the_bundle_already_deciding_swaps_nothing(line):
    current = _qc_bundle_param(line)
    swaps, running = line.h.node.bundle_swaps.swaps["qc"], line.decide(0)["bundle_sha256"]
    assert line.set_bundle(current).successful
    assert line.decide(1)["bundle_sha256"] == running
    assert line.h.node.bundle_swaps.swaps["qc"] == swaps


def _qc_bundle_param(line: Line) -> str:
    from rcl_interfaces.srv import GetParameters

    cli = line.node.create_client(GetParameters, "/sol_control/get_parameters")
    try:
        assert cli.wait_for_service(timeout_sec=10.0)
        future = cli.call_async(GetParameters.Request(names=["qc.bundle"]))
        assert wait_for(future.done, 10.0)
        return future.result().values[0].string_value
    finally:
        line.node.destroy_client(cli)


def _bad_bundle(case: str, tmp_path: Path) -> Path:
    if case == "flipped_byte":
        bundle = copy_bundle(QC_BUNDLE, tmp_path / "qc")
        p = bundle / "target_fused_int8.onnx"
        data = bytearray(p.read_bytes())
        data[len(data) // 3] ^= 0x01  # one flipped bit, same size
        p.write_bytes(bytes(data))
        return bundle
    if case == "bad_manifest":
        (tmp_path / "qc").mkdir()
        (tmp_path / "qc" / "manifest.json").write_text("{ not json")
        return tmp_path / "qc"
    if case == "grasp_bundle":
        return GRASP_BUNDLE
    return tmp_path / "no_such_folder"


# -- the frame boundary (runner.py), without ROS ----------------------------------------------------
class HeldStep:
    """A coprocessor whose step waits for `go`: a decision in progress for as long as the test wants."""

    def __init__(self, clock: ManualClock):
        self.gate, self.clock = DecidingGate(), clock
        self.cfg = from_flat({"mode": "qc", "deadline.sensor_timeout_ms": 60000.0})
        self.stepping, self.go = threading.Event(), threading.Event()

    def config(self):
        return self.cfg

    def step(self, telemetry, task=None) -> Decision:
        self.stepping.set()
        assert self.go.wait(30.0)
        f = telemetry.frame
        return safe_decision("qc", Failure("held"), f.stamp_ns, f.frame_id, f.start_mono_ns, 1000.0,
                             now_ns=self.clock.now_ns())


def _frame(clock: ManualClock, stamp: int) -> Telemetry:
    return Telemetry(Frame(np.zeros((8, 8, 3), np.uint8), stamp, clock.now_ns(), "qc_camera"))


@contextlib.contextmanager
def _runner_held_in_a_frame():
    """A runner whose first frame's decision is held until `cop.go` is set: (runner, cop, published,
    ran, clock)."""
    clock = ManualClock()
    cop, published, ran = HeldStep(clock), [], []
    runner = TaskRunner("qc", cop, published.append, CountingHooks(), clock)
    runner.start()
    try:
        runner.offer(_frame(clock, 1))
        assert cop.stepping.wait(10.0)
        yield runner, cop, published, ran, clock
    finally:
        cop.go.set()
        runner.stop()


def test_work_handed_to_the_runner_runs_between_frames_never_during_one():
    with _runner_held_in_a_frame() as (runner, cop, published, ran, _):
        answer: list[bool] = []
        handing = threading.Thread(target=lambda: answer.append(runner.at_boundary(lambda: ran.append(len(published)))))
        handing.start()
        assert wait_for(lambda: runner._boundary, 10.0)  # handed over while the decision runs
        assert ran == [] and not answer
        cop.go.set()
        handing.join(10.0)
        assert answer == [True] and ran == [1]  # after the frame's answer was published, not before


def test_work_that_meets_no_frame_boundary_in_time_never_runs():
    with _runner_held_in_a_frame() as (runner, cop, published, ran, clock):
        assert runner.at_boundary(lambda: ran.append("late"), timeout_s=0.05) is False
        cop.go.set()
        runner.offer(_frame(clock, 2))
        assert wait_for(lambda: len(published) == 2, 10.0)
        assert ran == []
    idle = TaskRunner("qc", HeldStep(clock), published.append, CountingHooks(), clock)
    assert idle.at_boundary(lambda: ran.append("now")) and ran == ["now"]  # no worker: at once


# -- the record ------------------------------------------------------------------------------------------
def test_bundle_sha256_travels_in_the_decision_record_and_names_runner_answers():
    from sol_control.ros.bundle_swap import named
    from sol_control.ros.convert import decision_from_status, decision_to_status

    sha = "ab" * 32
    d = safe_decision("qc", Failure("watchdog"), 5, "qc_camera", 1, 20.0, now_ns=2)
    assert d.bundle_sha256 == ""

    class Cop:
        def bundle_sha256(self, task):
            return sha if task == "qc" else ""
    d = named(d, Cop())
    status = decision_to_status(d)
    assert kv(status)["bundle_sha256"] == sha
    assert decision_from_status(status).bundle_sha256 == sha
    other = replace(d, bundle_sha256="cd" * 32)
    assert named(other, Cop()) is other  # a decision that names its bundle keeps it
    assert named(replace(d, bundle_sha256=""), None).bundle_sha256 == ""


def test_bench_swap_window_splits_the_hit_rate():
    from sol_control.bench.node_bench import swap_window

    ms = 1_000_000
    stamps = [i * 10 * ms for i in range(10)]  # 0..90 ms
    late = {30 * ms, 40 * ms}  # answered after the 5 ms deadline; 50 ms never answered
    rows = [[s, s + (8 * ms if s in late else 2 * ms)] for s in stamps if s != 50 * ms]
    w = swap_window(5.0, {"stamps": stamps}, rows, {"sent_ns": 25 * ms, "done_ns": 55 * ms})
    assert w["frames_in_window"] == 3 and w["decided_in_window"] == 2 and w["hit_rate_in_window"] == 0.0
    assert w["hit_rate_outside"] == 1.0 and w["window_ms"] == 30.0
