"""The package's layering, checked on the source: the core imports neither ROS, nor torch, nor the
synthetic-data generators; ROS, simulation and scoring code import decision types, not policy; and
the import graph of the package (and tools/) runs one way, bottom to top of `LAYERS`, without a
cycle between module groups or between modules (docs/ARCHITECTURE.md, "Layers")."""
from __future__ import annotations

import ast
import functools
from pathlib import Path

from tests.conftest import REPO

PKG = REPO / "sol_control"
# the ROS-free core: everything but the ROS layer, the simulator, benchmarks, evaluation, the
# synthetic tasks (their generators are dev/benchmark code) and `sol-control train` (torch)
EDGES = ("ros", "sim", "bench", "tasks", "train")
EDGE_FILES = ("eval.py", "cli.py")
# sol_control/train may import torch; these modules of it may not, because the rest of the package
# imports them (eval --folder reads folders; cli builds the train command's parser)
TRAIN_TORCH_FREE = ("__init__.py", "command.py", "config.py", "guess.py", "layout.py", "report.py")
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
    assert {"loop.py", "command.py"} <= set(files)
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


# -- the import graph: module groups, their layer order, no upward edge, no cycle ----------------------
# A module group is a top-level module of the package (`runner`, `coprocessor`) or a subpackage
# (`decoding`, `ros`); tools/ is one group. Layers from the bottom: a group imports groups of its own
# layer or of layers below it, never above. Imports inside functions count: they run all the same.
LAYERS = (
    ("budget", "params", "energy", "gc_pauses", "priority", "startup", "bundle", "native"),  # no package imports
    ("config",),
    ("actions", "telemetry"),
    ("decision",),
    ("decoding", "perception"),  # the engine: decoders (sessions, speculative decoding); image -> tokens
    ("graph", "tasks"),  # what the engine reads, made: fused graphs built; synthetic task scenes
    ("lm",),  # language models: import (GGUF, HF, ONNX) to bundles, tokenizer, generate
    ("planners",),
    ("audit",),
    ("policy",),
    ("guard",),
    ("coprocessor",),
    ("runner",),
    ("ros",),
    ("sim",),  # the simulated cell and its ROS bridge
    ("eval", "train", "bench", "doctor", "cli", "tools"),  # dev side: evaluation, training, measurement
)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # read once per run: every test of the graph looks at the same tree
def import_graph() -> dict[str, set[str]]:
    """Module -> the package (and tools/) modules it imports. `from pkg import mod` is an edge to
    `pkg.mod`, `from mod import name` one to `mod`; tools/ scripts import each other by file name."""
    files = list(PKG.rglob("*.py")) + list((REPO / "tools").glob("*.py"))
    known = {module_name(p): p for p in files if p != PKG / "__init__.py"}

    def resolve(name: str, src: str) -> str | None:
        for cand in ([name, f"tools.{name}"] if src.startswith("tools.") else [name]):
            parts = cand.split(".")
            for i in range(len(parts), 0, -1):
                if ".".join(parts[:i]) in known:
                    return ".".join(parts[:i])
        return None

    graph = {}
    for mod, path in known.items():
        out = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = next(iter(imports_of(ast.ImportFrom(node.module, [], node.level), path)))
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            out |= {r for n in names if (r := resolve(n, mod)) not in (None, mod, "sol_control")}
        graph[mod] = out
    return graph


def group(module: str) -> str:
    parts = module.split(".")
    return "tools" if parts[0] == "tools" else parts[1]


def group_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(importing group, imported group) -> the module imports that make that edge."""
    out: dict[tuple[str, str], list[str]] = {}
    for a, targets in graph.items():
        for b in targets:
            if group(a) != group(b):
                out.setdefault((group(a), group(b)), []).append(f"{a} -> {b}")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return sorted(found)


def layer_of() -> dict[str, int]:
    return {g: i for i, layer in enumerate(LAYERS) for g in layer}


def structure() -> dict:
    """The counts issue #49 measures: module groups, edges between them, upward edges, cycles."""
    graph = import_graph()
    edges = group_edges(graph)
    rank = layer_of()
    groups = {group(m) for m in graph}
    by_group: dict[str, set[str]] = {g: set() for g in groups}
    for a, b in edges:
        by_group[a].add(b)
    return {"groups": len(groups), "group_edges": len(edges),
            "upward": sorted(m for (a, b), ms in edges.items() if rank.get(b, -1) > rank.get(a, -1) for m in ms),
            "group_cycles": cycles(by_group), "module_cycles": cycles(graph), "unplaced": sorted(groups - set(rank))}


def test_every_module_group_has_a_layer():
    s = structure()
    assert s["groups"] >= 25 and not s["unplaced"], f"place these groups in LAYERS: {s['unplaced']}"


def test_no_group_imports_a_higher_layer():
    upward = structure()["upward"]
    assert not upward, "imports of a higher layer (LAYERS, bottom first):\n" + "\n".join(upward)


def test_no_import_cycles_between_groups_or_modules():
    s = structure()
    assert not s["group_cycles"], f"module groups that import each other: {s['group_cycles']}"
    assert not s["module_cycles"], f"modules that import each other: {s['module_cycles']}"


def test_the_graph_sees_what_it_checks():
    """The checks above can fail: the graph holds the edges a frame's path is made of, imports in
    functions and `from package import module` included, and a cycle is found."""
    graph = import_graph()
    assert "sol_control.coprocessor" in graph["sol_control.runner"]
    assert "sol_control.runner" in graph["sol_control.ros.node"]
    assert "sol_control.decoding" in graph["sol_control.planners"]  # an import inside a function
    assert "sol_control.native.isa" in graph["sol_control.decoding.native"]  # from ..native import isa
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    rank = layer_of()
    assert rank["budget"] < rank["decoding"] < rank["coprocessor"] < rank["runner"] < rank["ros"] < rank["sim"]
