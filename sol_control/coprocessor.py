"""The co-processor without ROS: `step(telemetry, budget) -> Decision`.

    Telemetry (frame + joints + conveyor) ─► perception: observation tokens (prefix ids)
        ─► deadline guard: fast | full_precision | safe_default ─► Decision (+ QC eject time)

One `TaskPipeline` per task (qc, grasp), each with its own bundle, sessions and guard. Everything
the pipeline needs to know about its model comes from the bundle's manifest (special tokens,
image size, camera calibration, action fields, warm-up prefixes). Everything heavy (sha256 checks,
ONNX sessions, KV caches, warm-up) happens in `Coprocessor.__init__` and `warmup()`; `step` only
runs models. The live config can be swapped at run time (`set_config`): deadlines, thresholds,
limits, audit rate and fault injection apply to the next decision. So can a task's bundle:
`load_pipeline` verifies and warms a new one beside the running one, `replace_pipeline` makes it
decide from the next step on (one reference swap). Every decision carries the sha256 of the
manifest of the bundle that made it (`bundle_sha256`).
"""
from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from sol_control.actions import ActionTokenizer, QCVerdict
from sol_control.audit import Auditor, DecidingGate
from sol_control.budget import MONOTONIC, NS_PER_MS, NS_PER_S, Budget, Clock
from sol_control.bundle import MANIFEST, Bundle, sha256_file
from sol_control.config import NodeConfig, Task
from sol_control.decision import Decision
from sol_control.guard import DeadlineGuard
from sol_control.planners import FastPlanner, FullPrecisionPlanner
from sol_control.telemetry import Conveyor, InputRejected, Telemetry, decode_compressed

# Decision workers share the GIL with whoever else runs Python in the process (the ROS executor's
# image callbacks and timers, the soak's drivers, the auditor). With the default 5 ms switch interval a
# worker returning from ONNX Runtime can wait that long for the GIL, on every call, and a decision
# labelled on time can leave late. 0.5 ms bounds that wait.
GIL_SWITCH_INTERVAL_S = 0.0005


def share_gil_quickly() -> None:
    """Set the interpreter's switch interval for a process that runs decision workers."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def eject_time_ns(stamp_ns: int, conveyor: Conveyor | None, camera_to_ejector_m: float) -> int:
    """When the part seen at `stamp_ns` under the camera reaches the ejector, on the ROS clock.

    Belt position at the image stamp, extrapolated from the newest conveyor reading, plus the
    camera-to-ejector distance, gives the belt position to wait for; at the measured belt speed
    that is reached at the returned time. 0 when the belt is stopped, reversing or unknown."""
    if conveyor is None or not (conveyor.velocity_mps > 1e-6) or not math.isfinite(conveyor.position_m):
        return 0
    v = conveyor.velocity_mps
    pos_at_image_m = conveyor.position_m + v * (stamp_ns - conveyor.stamp_ns) / NS_PER_S
    target_m = pos_at_image_m + camera_to_ejector_m
    return int(conveyor.stamp_ns + (target_m - conveyor.position_m) / v * NS_PER_S)


def manifest_sha256(bundle_dir) -> str:
    """sha256 of a bundle's manifest file ("" when there is none: Bundle.load says why)."""
    path = Path(bundle_dir) / MANIFEST
    return sha256_file(path) if path.is_file() else ""


class TaskPipeline:
    def __init__(self, task: Task, bundle_dir, config_fn, with_audit: bool, gate: DecidingGate | None = None):
        from sol_control.perception import ObservationTokenizer

        cfg: NodeConfig = config_fn()
        self._config_fn = config_fn
        self.task = task
        t0 = time.perf_counter()
        sha_before = manifest_sha256(bundle_dir)
        self.bundle = Bundle.load(bundle_dir)  # verifies every sha256 before any session exists
        self.bundle_sha256 = manifest_sha256(self.bundle.root)  # names the bundle in every decision
        if self.bundle_sha256 != sha_before:
            raise ValueError(f"bundle {self.bundle.root}: {MANIFEST} changed while it was being loaded")
        self.bundle_check_s = time.perf_counter() - t0
        if self.bundle.manifest.task != task:
            raise ValueError(f"{task}.bundle {bundle_dir} holds a {self.bundle.manifest.task!r} model, not {task}")
        self.observation = ObservationTokenizer.from_bundle(self.bundle)
        self.actions = ActionTokenizer.from_manifest(self.bundle.manifest)
        n = self.actions.n_tokens
        self.fast = FastPlanner(self.bundle, n, cfg.decoding, bin_range=self.actions.bin_range)
        self.full = FullPrecisionPlanner(self.bundle, n, cfg.decoding)
        self.auditor = None
        if with_audit:
            self.auditor = Auditor(FullPrecisionPlanner(self.bundle, n, cfg.decoding, tag="-audit"), self.actions, gate)
        self.guard = DeadlineGuard(task, self.fast, self.full, self.actions, config_fn,
                                   audit=self.auditor.submit if self.auditor else None)
        self.sessions_s = time.perf_counter() - t0 - self.bundle_check_s  # tokenizers, sessions, caches

    def prefix(self, telemetry: Telemetry) -> np.ndarray:
        frame = telemetry.frame
        image = frame.image_rgb
        if image is None:
            image = decode_compressed(frame.compressed or b"", frame.compressed_format,
                                      max_pixels=self._config_fn().inputs.max_image_pixels)
        joints = None
        n_joints = self.observation.n_joints
        if n_joints and telemetry.joints is not None:
            q = telemetry.joints.position_rad
            if len(q) < n_joints:  # arm joints first; extra entries (gripper fingers) are ignored
                raise InputRejected("joints_length_mismatch", f"{len(q)} joints, the model reads {n_joints}")
            joints = q[:n_joints]
        try:
            return self.observation.encode(image, joints)
        except ValueError as e:
            raise InputRejected("image_unusable", str(e)) from None

    def warmup_frame(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(image, joints) to warm perception on: seeded noise of the model's image size, which
        the measurement takes for an object everywhere, so every stage of it runs."""
        px = self.observation.image_px
        noise = np.random.default_rng(0).integers(0, 256, (px, px, 3), dtype=np.uint8)
        return noise, (np.zeros(self.observation.n_joints) if self.observation.n_joints else None)

    def warm_perception(self) -> None:
        """Measure the warm-up frame once: the first frame's perception costs 10-14 ms more than
        the next ones (OpenCV's and numpy's first calls), which made the first live decision miss
        its deadline. Nothing is counted; a rejection warms all the same."""
        try:
            self.observation.encode(*self.warmup_frame())
        except ValueError:
            pass

    def warmup_prefixes(self, n: int) -> list[np.ndarray]:
        """`n` prefixes to warm up on: the bundle's reference prefixes, cycled; for a bundle without
        them, the prefix of an observation whose every feature sits in its middle bin."""
        refs = self.bundle.reference_prefixes()
        if not refs:
            obs = self.observation
            refs = [np.asarray(obs.head + [s["offset"] + s["size"] // 2 for s in obs.features] + [obs.sep],
                               np.int64)]
        return [refs[i % len(refs)] for i in range(n)]

    def close(self) -> None:
        if self.auditor is not None:
            self.auditor.close()


class Coprocessor:
    """Loads the bundles for `cfg.mode`; `step` decides one task on one telemetry snapshot."""

    def __init__(self, cfg: NodeConfig, clock: Clock = MONOTONIC):
        self._cfg = cfg
        self.clock = clock
        with_audit = cfg.audit_rate > 0
        self.gate = DecidingGate()  # the runners mark their decisions on it; the audits wait for it
        self.pipelines: dict[str, TaskPipeline] = {
            task: TaskPipeline(task, cfg.bundle_dir(task), self.config, with_audit, self.gate) for task in cfg.tasks}

    # -- config ----------------------------------------------------------------------------------
    def config(self) -> NodeConfig:
        return self._cfg

    def set_config(self, cfg: NodeConfig) -> None:
        self._cfg = cfg  # one reference swap: a decision reads either the old or the new config

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(self.pipelines)

    # -- run -------------------------------------------------------------------------------------
    def warmup(self, runs: int | None = None) -> dict[str, float]:
        """Run each pipeline's perception on a noise frame and its planners on the bundle's warm-up
        prefixes so the first live decision is warm; seeds both latency models (until their first
        live runs: see guard.LatencyModel). Returns the last full-precision latency per task (ms)."""
        runs = runs or self._cfg.decoding.warmup_runs
        return {task: self._warm(p, runs) for task, p in self.pipelines.items()}

    def _warm(self, p: TaskPipeline, runs: int) -> float:
        """Warm one pipeline (see `warmup`); its last full-precision latency (ms)."""
        p.warm_perception()
        full_ms = math.nan
        for prefix in p.warmup_prefixes(runs):
            p.guard.measure_fast(prefix, Budget.unlimited(self.clock))
            full_ms = p.guard.measure_full(prefix, Budget.unlimited(self.clock))
        return full_ms

    # -- bundle swap -----------------------------------------------------------------------------
    def load_pipeline(self, task: str, bundle_dir) -> TaskPipeline:
        """A pipeline for `task` on the bundle in `bundle_dir`, verified (sha256) and warmed the way
        `warmup` warms at activation, beside the running one: it decides nothing until
        `replace_pipeline`. ValueError names what was refused; nothing of it is left open."""
        running = self.pipelines.get(task)
        if running is None:
            raise ValueError(f"task {task!r} is not configured (mode {self._cfg.mode})")
        p = TaskPipeline(task, bundle_dir, self.config, running.auditor is not None, self.gate)
        try:
            self._warm(p, self._cfg.decoding.warmup_runs)
        except Exception as e:  # noqa: BLE001 - any warm-up failure refuses the bundle
            p.close()
            raise ValueError(f"bundle {p.bundle.root}: warm-up failed: {type(e).__name__}: {e}") from e
        return p

    def replace_pipeline(self, task: str, p: TaskPipeline) -> TaskPipeline:
        """`p` decides `task` from the next `step` on; returns the pipeline it replaces (the caller
        closes it once no step can still run on it). One reference swap of the whole dict: a step
        runs entirely on the old or entirely on the new pipeline, and readers on other threads
        (stats) never see the dict change under them."""
        assert p.task == task, (p.task, task)
        old = self.pipelines[task]
        self.pipelines = {**self.pipelines, task: p}
        return old

    def bundle_sha256(self, task: str) -> str:
        """sha256 of the manifest of the bundle deciding `task` now ("" when none is)."""
        p = self.pipelines.get(task)
        return p.bundle_sha256 if p is not None else ""

    def load_times_s(self) -> dict[str, float]:
        """Where configure's time went, summed over tasks: sha256 checks, then sessions (and the rest)."""
        return {"bundle_check": sum(p.bundle_check_s for p in self.pipelines.values()),
                "sessions": sum(p.sessions_s for p in self.pipelines.values())}

    def budget_for(self, task: str, telemetry: Telemetry) -> Budget:
        return Budget.after_ms(self._cfg.deadline.for_task(task), start_ns=telemetry.frame.start_mono_ns,
                               clock=self.clock)

    def step(self, telemetry: Telemetry, budget: Budget | None = None, task: str | None = None) -> Decision:
        """Decide `task` (default: the only configured one) for this snapshot within `budget`
        (default: the task's deadline from the sensor stamp). Raises InputRejected for frames that
        cannot be decided on (the caller counts them); any other failure becomes a fallback.
        `cpu_ms` is this thread's CPU time for the step (ONNX Runtime runs on it with 1 thread)."""
        task = task or self.tasks[0]
        p = self.pipelines[task]
        budget = budget or self.budget_for(task, telemetry)
        cpu0 = time.thread_time_ns()
        t0 = self.clock.now_ns()
        prefix = p.prefix(telemetry)
        t1 = self.clock.now_ns()
        d = p.guard.decide(prefix, budget, telemetry.stamp_ns, telemetry.frame.frame_id)
        eject = 0
        if task == "qc" and isinstance(d.action, QCVerdict):
            eject = eject_time_ns(telemetry.stamp_ns, telemetry.conveyor, self._cfg.qc.camera_to_ejector_m)
        return replace(d, eject_time_ns=eject, queue_ms=(t0 - budget.start_ns) / NS_PER_MS,
                       perception_ms=(t1 - t0) / NS_PER_MS, cpu_ms=(time.thread_time_ns() - cpu0) / NS_PER_MS,
                       bundle_sha256=p.bundle_sha256)

    def background_thread_ids(self) -> set[int]:
        return {p.auditor.native_id for p in self.pipelines.values() if p.auditor and p.auditor.native_id}

    def stats(self) -> dict[str, dict[str, float | str]]:
        out = {}
        for task, p in self.pipelines.items():
            a = p.auditor
            out[task] = {
                "bundle": str(p.bundle.root),
                "bundle_sha256": p.bundle_sha256,
                "fast_backend": p.fast.backend,  # "native" or "onnxruntime" (decoding.backend)
                "fast_backend_info": p.fast.target.backend_info,  # variant, measured times, why
                "full_precision_estimate_ms": p.guard.full_latency.estimate_ms(),
                "fast_p50_ms": p.guard.fast_latency.estimate_ms(q=50.0),
                "fast_probes": p.guard.probes["fast"],  # skipped paths run anyway (guard.PROBE_EVERY)
                "full_precision_probes": p.guard.probes["full_precision"],
                # 0-2: how many of the two latency models still rest on warm-up runs only
                "latency_models_from_warmup": int(p.guard.fast_latency.seeded) + int(p.guard.full_latency.seeded),
                "audited": a.audited if a else 0,
                "audit_agreement": a.agreement if a else math.nan,
                "audit_token_identical": (a.token_identical / a.audited) if (a and a.audited) else math.nan,
                "audit_skipped": a.skipped if a else 0,
            }
        return out

    def close(self) -> None:
        for p in self.pipelines.values():
            p.close()
        self.pipelines = {}
