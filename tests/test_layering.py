"""The package's layering, checked on the source: the core imports neither ROS, nor torch, nor the
synthetic-data generators; ROS, simulation and scoring code import decision types, not policy."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PKG = REPO / "sol_control"
# the ROS-free core: everything but the ROS layer, the simulator, benchmarks, evaluation, the
# synthetic tasks (their generators are dev/benchmark code) and `sol-control train` (torch)
EDGES = ("ros", "sim", "bench", "tasks", "train")
EDGE_FILES = ("eval.py", "cli.py")
# sol_control/train may import torch; these modules of it may not, because the rest of the package
# imports them (eval --folder reads folders; cli builds the train command's parser)
TRAIN_TORCH_FREE = ("__init__.py", "command.py", "folder.py", "guess.py", "layout.py", "report.py")
# policy: how decisions are made. The node and replay run the Coprocessor (its facade), never these.
POLICY = {"sol_control.guard", "sol_control.planners", "sol_control.audit", "sol_control.policy"}


def imports(path: Path) -> set[str]:
    """Every module a file imports, function bodies included."""
    return {m for node in ast.walk(ast.parse(path.read_text())) for m in imports_of(node, path)}


def imports_of(node, path: Path) -> set[str]:
    out = set()
    if isinstance(node, ast.Import):
        out |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:  # relative: resolve against the file's package
            parts = path.relative_to(REPO).with_suffix("").parts[:-node.level]
            base = ".".join(parts + ((base,) if base else ()))
        out |= {base} | {f"{base}.{a.name}" for a in node.names}
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


def top_imports(path: Path) -> set[str]:
    """The imports a module runs when it is imported (its top level; function bodies run later)."""
    tree = ast.parse(path.read_text())
    return {m for node in tree.body for m in imports_of(node, path)}


def _torch_or_train(modules: set[str]) -> set[str]:
    """torch, transformers, and sol_control.train modules that may import them."""
    return {m for m in modules if m.split(".")[0] in ("torch", "transformers")
            or (m.startswith("sol_control.train.") and m.split(".")[2] + ".py" not in TRAIN_TORCH_FREE)}


def test_train_imports_torch_and_no_ros():
    files = {p.name: p for p in (PKG / "train").glob("*.py")}
    assert {"loop.py", "folder.py", "command.py"} <= set(files)
    assert _torch_or_train(imports(files["loop.py"]))  # so the rule below can fail
    for name, p in files.items():
        assert "rclpy" not in {m.split(".")[0] for m in imports(p)}, f"{p.relative_to(REPO)} imports rclpy"
        if name in TRAIN_TORCH_FREE:  # command.run imports the pipeline only when the command runs
            bad = _torch_or_train(top_imports(p))
            assert not bad, f"{p.relative_to(REPO)} must import without torch, imports {sorted(bad)}"


def test_only_torch_free_train_modules_are_imported_from_outside():
    for p in PKG.rglob("*.py"):
        if p.relative_to(PKG).parts[0] != "train":
            bad = {m for m in _torch_or_train(imports(p)) if m.startswith("sol_control.train")}
            assert not bad, f"{p.relative_to(REPO)} imports {sorted(bad)}, which import torch"
