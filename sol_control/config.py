"""The node's typed configuration: the single source of truth for ROS parameters, YAML and CLI.

Every field carries a description and its range; fields marked `structural` (STRUCTURAL) apply
at the next configure, when sessions are built. `sol_control.params` turns the models into the
flat, dotted ROS parameter names (`deadline.qc_ms`); the NodeConfig wrappers at the end
(`param_specs`, `from_flat`, `apply_overrides`, `load_yaml`, `render_yaml`) are what callers use.
Invalid values raise ValueError naming the field and the value given.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sol_control import params
from sol_control.energy import DEFAULT_WATTS_PER_BUSY_CORE

NODE_NAME = "sol_control"
STRUCT = {"structural": True}  # json_schema_extra of fields that apply at the next configure
DEFAULT_CAMERA_TO_EJECTOR_M = 0.5  # the simulated cell's geometry; a real line sets its own
Task = Literal["qc", "grasp"]
QC_CLASS_NAME = re.compile(r"[a-z][a-z0-9_]*")  # a defect label in policy.full_precision_qc_classes


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class DeadlineConfig(Strict):
    qc_ms: float = Field(20.0, gt=0.0, le=60000.0,
                         description="QC decision deadline, counted from the image header stamp (ms)")
    grasp_ms: float = Field(25.0, gt=0.0, le=60000.0,
                            description="grasp decision deadline, counted from the image header stamp (ms)")
    publish_margin_ms: float = Field(1.0, ge=0.0, le=100.0,
                                     description="budget kept back for conversion and publishing (ms)")
    fast_share: float = Field(1.0, gt=0.0, le=1.0,
                              description="largest share of the remaining budget the fast path may use")
    reserve_full_precision: bool = Field(
        True, description="when the deadline holds both, keep the full-precision planner's estimated "
                          "latency free for it by shortening the fast path's budget")
    min_fast_ms: float = Field(2.0, ge=0.0, le=60000.0,
                               description="never shorten the fast path's budget below this (ms)")
    full_precision_safety: float = Field(1.2, ge=1.0, le=10.0,
                                         description="multiplier on the full-precision planner's measured "
                                                     "p95 latency when judging whether it fits")
    max_staleness_ms: float = Field(100.0, gt=0.0, le=600000.0,
                                    description="frames older than this (header stamp to now) are not decided on (ms)")
    max_future_ms: float = Field(20.0, ge=0.0, le=60000.0,
                                 description="tolerated clock skew for stamps in the future (ms)")
    sensor_timeout_ms: float = Field(1000.0, gt=0.0, le=600000.0,
                                     description="without a usable frame for this long the node publishes safe "
                                                 "defaults and an ERROR diagnostic (ms)")
    output_deadline_ms: float = Field(500.0, json_schema_extra=STRUCT, ge=0.0, le=600000.0,
                                      description="QoS deadline offered on decision topics; 0 disables (ms)")

    def for_task(self, task: Task) -> float:
        return self.qc_ms if task == "qc" else self.grasp_ms


class DecodingConfig(Strict):
    fast_precision: Literal["int8", "int4"] = Field("int8", json_schema_extra=STRUCT, description="target precision of the fast path")
    draft_precision: Literal["auto", "fp32", "int8", "int4"] = Field(
        "auto", json_schema_extra=STRUCT, description="draft model precision; auto = the smallest file the bundle has for the draft")
    speculation: Literal["auto", "heads", "draft", "none"] = Field(
        "auto", json_schema_extra=STRUCT,
        description="how the fast path drafts: auto = the target's own draft heads when its fused graph has "
                    "them, else the bundle's draft model, else none (plain greedy on the quantized target)")
    k: int = Field(0, json_schema_extra=STRUCT, ge=0, le=16, description="draft tokens per verification; 0 = engine default (adaptive)")
    relax_delta: int = Field(0, json_schema_extra=STRUCT, ge=0, le=16,
                             description="lossy speed-up: accept a draft bin token within this many bins of the "
                                         "target's choice (0 = exact, output identical to greedy)")
    prefill_guesses: bool = Field(True, json_schema_extra=STRUCT,
                                  description="the prefill also checks the bundle's guesses of the answer's "
                                              "first tokens (target.guesses): fewer calls, the same output")
    threads: int = Field(1, json_schema_extra=STRUCT, ge=1, le=8,
                         description="threads per session: ONNX Runtime's intra-op threads, and the native pass's "
                                     "for its wide linears")
    backend: Literal["auto", "native", "onnxruntime"] = Field(
        "auto", json_schema_extra=STRUCT,
        description="what runs the fused graphs: auto = our C pass for the graphs it computes (`make native`) "
                    "unless ONNX Runtime measured at least 10 % faster on this CPU when the graph opened, ONNX "
                    "Runtime for the rest; native = the C pass or a configure error; onnxruntime = ONNX Runtime "
                    "only. SOL_CONTROL_BACKEND overrides auto")
    standard_only: bool = Field(False, description="skip the fast path: every decision from the fp32 planner "
                                                   "(the 'standard' baseline for comparisons)")
    warmup_runs: int = Field(8, json_schema_extra=STRUCT, ge=1, le=1000,
                             description="decisions run at activation per planner (also seeds the latency model)")


class QCConfig(Strict):
    bundle: str = Field("", description="QC model bundle folder; empty = the shipped models/qc; a change on a "
                                         "configured node swaps it in between two frames (refused if it fails checks)")
    min_confidence: float = Field(0.5, ge=0.0, le=1.0,
                                  description="fast-path QC results below this confidence go to full precision")
    uncertain_below: float = Field(0.5, ge=0.0, le=1.0,
                                   description="final QC verdicts below this confidence become 'uncertain'")
    camera_to_ejector_m: float = Field(DEFAULT_CAMERA_TO_EJECTOR_M, ge=0.0, le=100.0,
                                       description="belt distance from the camera centre to the ejector (m)")


class GraspConfig(Strict):
    bundle: str = Field("", description="grasp model bundle folder; empty = the shipped models/grasp; a change on a "
                                         "configured node swaps it in between two frames (refused if it fails checks)")
    min_confidence: float = Field(0.3, ge=0.0, le=1.0,
                                  description="fast-path grasps below this confidence go to full precision")
    frame_id: str = Field("pick_table", description="frame of grasp outputs; empty = the image header frame")


class LimitsConfig(Strict):
    """The cell's safe envelope for grasps, in frame pick_table (REP-103: m, rad, N)."""

    x_min_m: float = Field(-0.12, ge=-10.0, le=10.0, description="workspace lower x bound (m)")
    x_max_m: float = Field(0.12, ge=-10.0, le=10.0, description="workspace upper x bound (m)")
    y_min_m: float = Field(-0.12, ge=-10.0, le=10.0, description="workspace lower y bound (m)")
    y_max_m: float = Field(0.12, ge=-10.0, le=10.0, description="workspace upper y bound (m)")
    z_min_m: float = Field(0.0, ge=-10.0, le=10.0, description="workspace lower z bound (m)")
    z_max_m: float = Field(0.4, ge=-10.0, le=10.0, description="workspace upper z bound (m)")
    width_min_m: float = Field(0.0, ge=0.0, le=2.0, description="smallest gripper opening (m)")
    width_max_m: float = Field(0.11, ge=0.0, le=2.0, description="largest gripper opening (m)")
    force_min_n: float = Field(0.0, ge=0.0, le=10000.0, description="smallest grip force (N)")
    force_max_n: float = Field(80.0, ge=0.0, le=10000.0, description="largest grip force (N)")

    @model_validator(mode="after")
    def _ordered(self) -> "LimitsConfig":
        for lo, hi in (("x_min_m", "x_max_m"), ("y_min_m", "y_max_m"), ("z_min_m", "z_max_m"),
                       ("width_min_m", "width_max_m"), ("force_min_n", "force_max_n")):
            if getattr(self, lo) > getattr(self, hi):
                raise ValueError(f"limits.{lo} must be <= limits.{hi}, got {getattr(self, lo)} > {getattr(self, hi)}")
        return self


class PolicyConfig(Strict):
    """Full precision where it matters: fast answers these rules cover go to the fp32 planner
    (`sol_control/policy.py`); the deadline guard still rules. Every rule is off by default."""

    full_precision_qc_classes: str = Field(
        "", max_length=400, description="comma-separated defect classes (the bundle's labels, e.g. "
                                        "crack,missing_hole) whose fast QC verdicts go to full precision; "
                                        "empty = off")
    full_precision_qc_min_severity: float = Field(
        0.0, ge=0.0, le=1.0, description="fast QC rejects with a severity at or above this go to full "
                                         "precision; 0 = off")
    full_precision_grasp_min_force_n: float = Field(
        0.0, ge=0.0, le=10000.0, description="fast grasps with a grip force at or above this go to full "
                                             "precision (N); 0 = off")
    full_precision_workspace_margin_m: float = Field(
        0.0, ge=0.0, le=1.0, description="fast grasps whose grasp point or an approach waypoint lies within "
                                         "this distance of an x/y workspace limit go to full precision (m); "
                                         "0 = off")

    @field_validator("full_precision_qc_classes")
    @classmethod
    def _class_names(cls, value: str) -> str:
        names = [n.strip() for n in value.split(",")] if value.strip() else []
        bad = [n for n in names if not QC_CLASS_NAME.fullmatch(n)]
        if bad:
            raise ValueError(f"class names must be lower-case labels separated by commas "
                             f"(e.g. crack,missing_hole), got {bad}")
        return ",".join(names)

    @property
    def qc_classes(self) -> frozenset[str]:
        return frozenset(self.full_precision_qc_classes.split(",")) - {""}

    @property
    def active(self) -> bool:
        return bool(self.qc_classes or self.full_precision_qc_min_severity
                    or self.full_precision_grasp_min_force_n or self.full_precision_workspace_margin_m)


class EnergyConfig(Strict):
    watts_per_busy_core: float = Field(
        DEFAULT_WATTS_PER_BUSY_CORE, gt=0.0, le=1000.0,
        description="assumed power of one busy CPU core, used for joules per decision when RAPL cannot "
                    "be read (W; the default is a many-core server CPU's TDP per core: AMD EPYC 9655, 400 W / 96 cores)")


class InputConfig(Strict):
    max_image_pixels: int = Field(4_194_304, ge=1, le=100_000_000,
                                  description="images with more pixels (width*height) are rejected")
    max_compressed_bytes: int = Field(8_388_608, ge=1, le=1_000_000_000,
                                      description="compressed images larger than this are rejected (bytes)")
    max_joints: int = Field(64, ge=1, le=4096,
                            description="JointState messages with more entries are rejected")
    max_joint_abs: float = Field(1000.0, gt=0.0, le=1e9,
                                 description="joint positions/velocities beyond this magnitude are rejected")
    max_wrench_abs: float = Field(10000.0, gt=0.0, le=1e9,
                                  description="force (N) / torque (N m) components beyond this are rejected")
    max_belt_speed_mps: float = Field(10.0, gt=0.0, le=1000.0,
                                      description="conveyor speeds beyond this are rejected (m/s)")


class FaultInjection(Strict):
    """Test hooks, all off by default: they slow or break the planners on purpose."""

    fast_delay_ms: float = Field(0.0, ge=0.0, le=60000.0, description="TEST ONLY: sleep added inside the fast planner (ms)")
    fast_raise: bool = Field(False, description="TEST ONLY: the fast planner raises")
    full_delay_ms: float = Field(0.0, ge=0.0, le=60000.0, description="TEST ONLY: sleep added inside the full-precision planner (ms)")


class QoSConfig(Strict):
    """DDS QoS of the decision topics (docs/ROS_INTERFACE.md, "Liveliness")."""

    liveliness_lease_ms: float = Field(
        500.0, json_schema_extra=STRUCT, ge=0.0, le=600000.0,
        description="AUTOMATIC liveliness lease offered on the decision topics: a subscriber that requests a "
                    "lease >= this learns within it that the node is gone (keep it well under a part's "
                    "camera-to-ejector transit); 0 = no lease (infinite) (ms)")


class NodeConfig(Strict):
    mode: Literal["qc", "grasp", "both"] = Field("both", json_schema_extra=STRUCT, description="which decisions to make: qc, grasp or both")
    nice: int = Field(0, json_schema_extra=STRUCT, ge=-20, le=19,
                      description="CPU priority (Linux nice) of the node's threads at activation, except the "
                                  "shadow audit (always 19), and of its session when the node leads one and "
                                  "sched_autogroup is in effect (it ranks sessions first); below 0 needs "
                                  "CAP_SYS_NICE, 0 = leave as is")
    autostart: bool = Field(True, description="configure and activate at start (no lifecycle manager needed)")
    audit_rate: float = Field(0.05, ge=0.0, le=1.0,
                              description="fraction of fast decisions recomputed at full precision in the background")
    deadline: DeadlineConfig = DeadlineConfig()
    decoding: DecodingConfig = DecodingConfig()
    qc: QCConfig = QCConfig()
    grasp: GraspConfig = GraspConfig()
    limits: LimitsConfig = LimitsConfig()
    policy: PolicyConfig = PolicyConfig()
    energy: EnergyConfig = EnergyConfig()
    inputs: InputConfig = InputConfig()
    fault_injection: FaultInjection = FaultInjection()
    qos: QoSConfig = QoSConfig()

    @property
    def tasks(self) -> tuple[Task, ...]:
        return ("qc", "grasp") if self.mode == "both" else (self.mode,)

    def bundle_dir(self, task: Task) -> Path:
        given = (self.qc if task == "qc" else self.grasp).bundle
        return Path(given).expanduser() if given else shipped_bundle(task)




def shipped_bundle(task: Task) -> Path:
    """models/<task> next to the source tree, or share/sol_control/models/<task> when installed."""
    here = Path(__file__).resolve().parent
    candidates = [here.parent / "models" / task]
    try:  # an ament install (colcon) puts data under share/
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory(NODE_NAME)) / "models" / task)
    except Exception:  # noqa: BLE001 - ament index absent or package not installed: not an error here
        pass
    for c in candidates:
        if (c / "manifest.json").is_file():
            return c
    return candidates[0]


# -- flat views (sol_control.params) for NodeConfig ------------------------------------------------
def param_specs() -> list[params.ParamSpec]:
    return params.param_specs(NodeConfig)


def to_flat(cfg: NodeConfig) -> dict[str, Any]:
    return params.to_flat(cfg)


def validate(data: dict[str, Any]) -> NodeConfig:
    """Nested dict -> NodeConfig; ValueError names each bad field and the value given."""
    return params.validate(NodeConfig, data)


def from_flat(flat: dict[str, Any], base: NodeConfig | None = None) -> NodeConfig:
    """Dotted keys (ROS parameter names) -> NodeConfig, on top of `base` (defaults if None)."""
    return params.from_flat(NodeConfig, flat, base)


def apply_overrides(cfg: NodeConfig, pairs: list[str]) -> NodeConfig:
    """CLI `KEY=VALUE` pairs (YAML scalars: 5, 0.5, true, qc) on top of `cfg`."""
    return params.apply_overrides(cfg, pairs)


def load_yaml(path: str | Path, node_name: str = NODE_NAME) -> NodeConfig:
    """Read a ROS 2 params file (`<node>: ros__parameters: {...}` or `/**:`) into a NodeConfig."""
    return params.load_yaml(NodeConfig, path, node_name)


YAML_HEADER = """sol_control defaults (ROS 2 params file), generated from sol_control/config.py by
`python -m sol_control.config > config/sol_control.yaml` (a test fails when it is stale).
The same names work as ROS parameters (`ros2 param set /sol_control deadline.qc_ms 8.0`),
here, and as CLI overrides (`--param deadline.qc_ms=8`). Floats need a decimal point.
The key /** applies the file to whichever node it is given to, in any namespace and under any
name (/line1/sol_control, sol_control_qc); a `sol_control:` key would match /sol_control only."""
PARAMS_FILE_KEY = "/**"  # a params file's node key that matches every node name and namespace


def render_yaml() -> str:
    return params.render_yaml(NodeConfig, PARAMS_FILE_KEY, YAML_HEADER)


def render_markdown() -> str:
    return params.markdown_table(NodeConfig)


if __name__ == "__main__":  # python -m sol_control.config [--markdown]
    import sys

    print(render_markdown() if "--markdown" in sys.argv[1:] else render_yaml(), end="")


STRUCTURAL = params.structural(NodeConfig)
