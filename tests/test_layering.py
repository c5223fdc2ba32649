"""The package's layering, checked on the source: the core imports neither ROS, nor torch, nor the
synthetic-data generators; ROS, simulation and scoring code import decision types, not policy."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PKG = REPO / "sol_control"
# the ROS-free core: everything but the ROS layer, the simulator, benchmarks, evaluation and the
# synthetic tasks (their generators are dev/benchmark code)
EDGES = ("ros", "sim", "bench", "tasks")
EDGE_FILES = ("eval.py", "cli.py")
# policy: how decisions are made. The node and replay run the Coprocessor (its facade), never these.
POLICY = {"sol_control.guard", "sol_control.planners", "sol_control.audit", "sol_control.policy"}


def imports(path: Path) -> set[str]:
    out = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:  # relative: resolve against the file's package
                parts = path.relative_to(REPO).with_suffix("").parts[:-n.level]
                base = ".".join(parts + ((base,) if base else ()))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in n.names}
    return out


def core_files() -> list[Path]:
    return [p for p in PKG.rglob("*.py") if p.relative_to(PKG).parts[0] not in EDGES
            and p.name not in EDGE_FILES]


def test_the_core_imports_no_ros_no_torch_no_task_generators():
    files = core_files()
    assert PKG / "runner.py" in files and PKG / "decoding" / "speculative.py" in files
    for p in files:
        bad = {m for m in imports(p) if m.split(".")[0] in ("rclpy", "torch", "transformers")
               or m.startswith("sol_control.tasks") or m.endswith(".msg")}
        assert not bad, f"{p.relative_to(REPO)} imports {sorted(bad)}"


def test_ros_sim_and_scoring_import_types_not_policy():
    for sub in ("ros", "sim"):
        for p in (PKG / sub).rglob("*.py"):
            bad = imports(p) & POLICY
            assert not bad, f"{p.relative_to(REPO)} imports policy {sorted(bad)}"
