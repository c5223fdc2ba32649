"""Static checks of what `ros2 launch` / `ros2 run` would use (launch and launch_ros are not
installable here): entry points, launch arguments, params files, the Fast DDS profile, package.xml."""
import ast
import importlib
import re
import xml.etree.ElementTree as ET

import pytest
import yaml

from sol_control.config import load_yaml, param_specs
from tests.conftest import REPO

LAUNCH_ARGS = {"namespace", "params_file", "autostart", "dds_profile"}


def console_scripts() -> dict[str, str]:
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if isinstance(k, ast.Constant) and k.value == "console_scripts":
                    entries = [e.value for e in v.elts]
                    return {e.split("=")[0].strip(): e.split("=")[1].strip() for e in entries}
    raise AssertionError("no console_scripts in setup.py")


def test_coprocessor_entry_point_resolves_to_main():
    target = console_scripts()["coprocessor"]
    module, func = target.split(":")
    assert callable(getattr(importlib.import_module(module), func))


def _python_launch() -> ast.Module:
    return ast.parse((REPO / "launch" / "coprocessor.launch.py").read_text())


def test_python_launch_file_parses_and_names_existing_executables():
    tree = _python_launch()
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "generate_launch_description" in funcs
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    nodes = [c for c in calls if getattr(c.func, "id", "") in ("Node", "LifecycleNode")]
    assert nodes
    scripts = console_scripts()
    for c in nodes:
        kw = {k.arg: k.value for k in c.keywords}
        assert kw["package"].value == "sol_control"
        assert kw["executable"].value in scripts
        assert kw["name"].value == "sol_control"
    declared = {c.args[0].value for c in calls if getattr(c.func, "id", "") == "DeclareLaunchArgument"}
    assert declared == LAUNCH_ARGS
    used = {c.args[0].value for c in calls if getattr(c.func, "id", "") == "LaunchConfiguration"}
    assert used <= declared
    shared = {c.args[0].elts[2].value for c in calls if getattr(c.func, "id", "") == "PathJoinSubstitution"}
    for name in shared:
        assert (REPO / "config" / name).is_file(), name


def test_xml_launch_file_matches():
    root = ET.parse(REPO / "launch" / "coprocessor.launch.xml").getroot()
    assert root.tag == "launch"
    declared = {a.get("name") for a in root.findall("arg")}
    assert declared == LAUNCH_ARGS
    text = (REPO / "launch" / "coprocessor.launch.xml").read_text()
    assert set(re.findall(r"\$\(var (\w+)\)", text)) <= declared
    for f in re.findall(r"\$\(find-pkg-share sol_control\)/config/([\w.]+)", text):
        assert (REPO / "config" / f).is_file(), f
    nodes = root.findall("node") + root.findall("lifecycle_node")
    assert len(nodes) == 1
    n = nodes[0]
    assert n.get("pkg") == "sol_control" and n.get("exec") in console_scripts() and n.get("name") == "sol_control"


def test_every_coprocessor_launch_respawns_like_the_demo():
    """launch/ starts a coprocessor that died again after the delay the demo's own supervisor uses;
    autostart (on in every launch file) configures and activates the new process."""
    from sol_control.sim.supervisor import RESPAWN_DELAY_S

    for name in ("coprocessor.launch.py", "sim_demo.launch.py", "gazebo_cell.launch.py"):
        tree = ast.parse((REPO / "launch" / name).read_text())
        consts = {n.targets[0].id: n.value.value for n in tree.body
                  if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}
        nodes = [{k.arg: k.value for k in c.keywords} for c in _calls(tree, "LifecycleNode")]
        assert nodes, name
        for kw in nodes:
            assert kw["executable"].value == "coprocessor" and kw["respawn"].value is True, name
            delay = kw["respawn_delay"]
            assert (consts[delay.id] if isinstance(delay, ast.Name) else delay.value) == RESPAWN_DELAY_S, name
            assert "autostart" in ast.unparse(kw["parameters"]), name
    for name in ("coprocessor.launch.xml", "gazebo_cell.launch.xml"):
        nodes = [n for n in ET.parse(REPO / "launch" / name).getroot().iter("node") if n.get("exec") == "coprocessor"]
        assert nodes, name
        for n in nodes:
            assert n.get("respawn") == "true" and float(n.get("respawn_delay")) == RESPAWN_DELAY_S, name
            assert any(p.get("name") == "autostart" for p in n.findall("param")), name


def test_setup_installs_launch_and_config():
    text = (REPO / "setup.py").read_text()
    assert '"launch/*"' in text and '"config/*"' in text


def _ros_params_files() -> list:
    """config/*.yaml that are ROS 2 params files (`<node>: ros__parameters:`), not other YAML."""
    out = []
    for p in sorted((REPO / "config").glob("*.yaml")):
        doc = yaml.safe_load(p.read_text())
        if isinstance(doc, dict) and any(isinstance(v, dict) and "ros__parameters" in v for v in doc.values()):
            out.append(p)
    return out


def test_shipped_params_file_exists():
    assert REPO / "config" / "sol_control.yaml" in _ros_params_files()


@pytest.mark.parametrize("path", _ros_params_files(), ids=lambda p: p.name)
def test_params_files_validate_with_ros_types(path):
    load_yaml(path)  # raises ValueError naming the field on any bad value
    doc = yaml.safe_load(path.read_text())
    params = next(v["ros__parameters"] for k, v in doc.items() if "ros__parameters" in (v or {}))
    kinds = {s.name: s.kind for s in param_specs()}

    def walk(d, prefix=""):
        for k, v in d.items():
            if isinstance(v, dict):
                yield from walk(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v
    for name, value in walk(params):
        # ROS types a parameter from its YAML literal: 10 is an integer, 10.0 a double
        assert type(value) is kinds[name], f"{path.name}: {name} = {value!r} must be a {kinds[name].__name__}"


def test_fastdds_profile_is_shm_plus_loopback_only():
    ns = {"d": "http://www.eprosima.com"}
    root = ET.parse(REPO / "config" / "fastdds_localhost.xml").getroot()
    descriptors = {d.findtext("d:transport_id", namespaces=ns): d for d in root.iterfind(".//d:transport_descriptor", ns)}
    kinds = {tid: d.findtext("d:type", namespaces=ns) for tid, d in descriptors.items()}
    assert sorted(kinds.values()) == ["SHM", "UDPv4"]
    shm = next(d for d in descriptors.values() if d.findtext("d:type", namespaces=ns) == "SHM")
    assert int(shm.findtext("d:segment_size", namespaces=ns)) == 16 * 1024 * 1024
    assert int(shm.findtext("d:maxMessageSize", namespaces=ns)) == 4 * 1024 * 1024
    udp = next(d for d in descriptors.values() if d.findtext("d:type", namespaces=ns) == "UDPv4")
    assert [a.text for a in udp.iterfind(".//d:interfaceWhiteList/d:address", ns)] == ["127.0.0.1"]
    participant = root.find(".//d:participant", ns)
    assert participant.get("is_default_profile") == "true"
    assert participant.findtext(".//d:useBuiltinTransports", namespaces=ns) == "false"
    used = [t.text for t in participant.iterfind(".//d:userTransports/d:transport_id", ns)]
    assert sorted(used) == sorted(descriptors)


def test_package_xml_declares_every_message_package_the_ros_layer_imports():
    deps = {e.text for e in ET.parse(REPO / "package.xml").getroot().iter("exec_depend")}
    imported = set()
    for f in (REPO / "sol_control" / "ros").glob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0].endswith("_msgs"):
                imported.add(node.module.split(".")[0])
    assert imported and imported <= deps | {"builtin_interfaces", "rcl_interfaces"}, imported - deps


def test_core_is_ros_free():
    """rclpy only in sol_control/ros/ and the simulator's two ROS nodes (the cell's bridge, the line
    player of `sol-control lines`); torch nowhere the node can reach (the transformers peer worker,
    bench/peers/hf_transformers.py, runs in .venv-peers subprocesses only; sol_control/train/ is
    `sol-control train`, the dev/train extra, which tests/test_layering.py keeps out of the node's reach)."""
    ros_ok = {REPO / "sol_control" / "sim" / "bridge.py", REPO / "sol_control" / "sim" / "line_player.py"}
    torch_ok = {REPO / "sol_control" / "bench" / "peers" / "hf_transformers.py"}
    for f in (REPO / "sol_control").rglob("*.py"):
        src = f.read_text()
        if "ros" not in f.relative_to(REPO / "sol_control").parts[:1] and f not in ros_ok:
            assert not re.search(r"^\s*(import|from)\s+rclpy\b", src, re.M), f
        if f not in torch_ok and "train" not in f.relative_to(REPO / "sol_control").parts[:1]:  # train/: dev extra
            assert not re.search(r"^\s*(import|from)\s+torch\b", src, re.M), f


def test_every_parameter_is_documented():
    docs = [p for p in (REPO / "README.md", REPO / "docs" / "ROS_INTERFACE.md")
            if p.is_file() and "ROS 2 interface" in p.read_text()]
    assert docs, "no ROS 2 interface section in README.md or docs/ROS_INTERFACE.md"
    text = "\n".join(p.read_text() for p in docs)
    missing = [s.name for s in param_specs() if f"`{s.name}`" not in text]
    assert not missing, missing


def test_sim_demo_launch_names_existing_executables():
    tree = ast.parse((REPO / "launch" / "sim_demo.launch.py").read_text())
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    scripts = console_scripts()
    execs = [{k.arg: k.value for k in c.keywords}["executable"].value
             for c in calls if getattr(c.func, "id", "") in ("Node", "LifecycleNode")]
    assert sorted(execs) == ["cell_sim", "coprocessor"] and all(e in scripts for e in execs)
    declared = {c.args[0].value for c in calls if getattr(c.func, "id", "") == "DeclareLaunchArgument"}
    used = {c.args[0].value for c in calls if getattr(c.func, "id", "") == "LaunchConfiguration"}
    assert used <= declared


GZ_LAUNCH_ARGS = {"world_dir", "gz_args", "belt_speed_mps", "belt_start_s", "params_file", "bridge_file", "dds_profile"}


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == name]


def _gz_bridge_topics() -> set[str]:
    return {e["gz_topic_name"] for e in yaml.safe_load((REPO / "config" / "gz_bridge.yaml").read_text())}


def test_gazebo_launch_starts_gz_sim_the_bridge_and_both_coprocessors():
    from sol_control.sim.config import ConveyorConfig

    tree = ast.parse((REPO / "launch" / "gazebo_cell.launch.py").read_text())
    declared = {c.args[0].value: {k.arg: k.value for k in c.keywords} for c in _calls(tree, "DeclareLaunchArgument")}
    assert set(declared) == GZ_LAUNCH_ARGS
    assert {c.args[0].value for c in _calls(tree, "LaunchConfiguration")} <= set(declared)
    for c in _calls(tree, "PathJoinSubstitution"):
        parts = [e.value for e in c.args[0].elts if isinstance(e, ast.Constant)]
        if parts and parts[0] == "config":
            assert (REPO / "config" / parts[1]).is_file(), parts
    assert declared["belt_speed_mps"]["default_value"].value == str(ConveyorConfig().belt_speed_mps)
    # gz sim with world_dir/world.sdf and world_dir/models on the resource path
    cmds = [ast.unparse(c) for c in _calls(tree, "ExecuteProcess")]
    assert any("'gz', 'sim'" in c and "'world.sdf'" in c for c in cmds)
    env = _calls(tree, "AppendEnvironmentVariable")
    assert env and env[0].args[0].value == "GZ_SIM_RESOURCE_PATH" and "'models'" in ast.unparse(env[0])
    # the belt command goes to a topic the bridge also maps (and the world's TrackController reads)
    belt_topic = next(n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "BELT_TOPIC")
    assert belt_topic in _gz_bridge_topics() and any("BELT_TOPIC" in c for c in cmds)
    # ros_gz_bridge with the package's mapping
    nodes = {(kw["package"].value, kw["executable"].value): kw
             for kw in ({k.arg: k.value for k in c.keywords} for c in _calls(tree, "Node") + _calls(tree, "LifecycleNode"))}
    bridge = nodes[("ros_gz_bridge", "parameter_bridge")]
    assert "config_file" in ast.unparse(bridge["parameters"]) and "bridge_file" in ast.unparse(bridge["parameters"])
    assert nodes[("sol_control", "coprocessor")]["executable"].value in console_scripts()
    assert sorted(c.args[0].value for c in _calls(tree, "coprocessor")) == ["grasp", "qc"]
    # the co-processors start exactly as in the MuJoCo demo launch
    demo = ast.parse((REPO / "launch" / "sim_demo.launch.py").read_text())

    def helper(t):
        return ast.dump(next(n for n in t.body if isinstance(n, ast.FunctionDef) and n.name == "coprocessor"))
    assert helper(tree) == helper(demo)


def test_gazebo_launch_xml_matches_the_python_one():
    path = REPO / "launch" / "gazebo_cell.launch.xml"
    root = ET.parse(path).getroot()
    text = path.read_text()
    assert {a.get("name") for a in root.findall("arg")} == GZ_LAUNCH_ARGS
    assert set(re.findall(r"\$\(var (\w+)\)", text)) <= GZ_LAUNCH_ARGS
    for f in re.findall(r"\$\(find-pkg-share sol_control\)/config/([\w.]+)", text):
        assert (REPO / "config" / f).is_file(), f
    default = {a.get("name"): a.get("default") for a in root.findall("arg")}
    py = (REPO / "launch" / "gazebo_cell.launch.py").read_text()
    for name in ("gz_args", "belt_speed_mps", "belt_start_s"):
        assert f'"{name}", default_value="{default[name]}"' in py, name
    env = root.find("append_env")
    assert env.get("name") == "GZ_SIM_RESOURCE_PATH" and env.get("value") == "$(var world_dir)/models"
    sim = root.find("executable").get("cmd")
    assert sim.startswith("gz sim -r ") and sim.endswith(" $(var world_dir)/world.sdf")
    belt = root.find("timer/executable").get("cmd").split()
    assert belt[:4] == ["gz", "topic", "-t", "/model/conveyor/link/frame/track_cmd_vel"] and belt[3] in _gz_bridge_topics()
    nodes = {n.get("name"): n for n in root.findall("node")}
    assert nodes["gz_bridge"].get("pkg") == "ros_gz_bridge" and nodes["gz_bridge"].get("exec") == "parameter_bridge"
    assert nodes["gz_bridge"].find("param").attrib == {"name": "config_file", "value": "$(var bridge_file)"}
    for task, camera in (("qc", "qc"), ("grasp", "pick")):
        n = nodes[f"sol_control_{task}"]
        assert n.get("pkg") == "sol_control" and n.get("exec") in console_scripts()
        params = {p.get("name"): p.get("value") for p in n.findall("param") if p.get("name")}
        assert params == {"mode": task, "use_sim_time": "true", "autostart": "true",
                          "deadline.sensor_timeout_ms": "600000.0"}
        assert [p.get("from") for p in n.findall("param") if p.get("from")] == ["$(var params_file)"]
        assert n.find("remap").attrib == {"from": "camera/image_raw", "to": f"{camera}/camera/image_raw"}
