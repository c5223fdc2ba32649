"""The Gazebo world of the cell (sol_control/sim/sdf*.py, gazebo_world.py), checked without Gazebo:

- libsdformat 12 (tools/sdf_check.cpp, built by `make sdf-check`) loads the world and every per-run
  model without an error, and rejects broken ones;
- every Gazebo topic in config/gz_bridge.yaml exists in the world, and the bridge gives the
  coprocessor nodes (sol_control/ros/node.py, launch/gazebo_cell.launch.py) what they read, typed
  as they read it;
- the cameras are the MuJoCo cameras: size, view extent, axis, orientation, and the same image when
  MuJoCo renders through the SDF camera's pinhole;
- parts, pick scenes, textures and mass properties are the MuJoCo cell's for the same seed.
"""
import ast
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import yaml

import mujoco  # a runtime pin: missing is a failure, not a skip

from sol_control.sim import scene, sdf  # noqa: E402
from sol_control.sim.config import ConveyorConfig  # noqa: E402
from sol_control.sim.gazebo_world import main, pick_scenes, qc_schedule, write_run  # noqa: E402
from sol_control.sim.inertia import body_props  # noqa: E402
from sol_control.sim.sdf_models import padded_half_m  # noqa: E402
from sol_control.tasks.common import GRASP_IMAGE_PX, QC_IMAGE_PX, grasp_m_to_px, qc_m_to_px  # noqa: E402
from tests.conftest import REPO  # noqa: E402

CHECKER = REPO / "build" / "sdf_check"
BRIDGE = yaml.safe_load((REPO / "config" / "gz_bridge.yaml").read_text())
WORLD = "sol_control_cell"
PICK_CONTROL_STANDOFF_M = 0.8      # negative control: a pinhole at the MuJoCo pick camera's height


@pytest.fixture(scope="module")
def checker() -> Path:
    """build/sdf_check, built by `make sdf-check` (which installs libsdformat-dev if it is missing)."""
    r = subprocess.run(["make", "-s", "sdf-check"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and CHECKER.is_file(), r.stdout + r.stderr
    return CHECKER


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gz_run")
    plan = write_run(out, seed=3, duration_s=12.0, n_scenes=3)
    return out, plan


def sdf_check(checker: Path, files, models_dir: Path | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GZ_SIM_RESOURCE_PATH"}
    if models_dir is not None:
        env["GZ_SIM_RESOURCE_PATH"] = str(models_dir)
    return subprocess.run([str(checker), *map(str, files)], capture_output=True, text=True, env=env, timeout=120)


def world_root(out: Path) -> ET.Element:
    return ET.parse(out / "world.sdf").getroot()


# ---- the parser ---------------------------------------------------------------------------------

@pytest.mark.process
def test_world_and_every_model_load_without_errors(checker, run):
    out, plan = run
    models = sorted((out / "models").glob("*/model.sdf"))
    assert len(models) == len(plan["qc_parts"]) + sum(len(s["objects"]) for s in plan["pick_scenes"])
    r = sdf_check(checker, [out / "world.sdf", *models], out / "models")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("OK ") == 1 + len(models)
    assert f'(SDF 1.9, 1 world(s): "{WORLD}"' in r.stdout


def _break(out: Path, tmp_path: Path, old: str, new: str) -> Path:
    text = (out / "world.sdf").read_text()
    assert old in text
    bad = tmp_path / "broken.sdf"
    bad.write_text(text.replace(old, new, 1))
    return bad


@pytest.mark.process
def test_checker_rejects_broken_worlds(checker, run, tmp_path):
    out, _ = run
    cases = {  # what is broken → (old text, new text, error the checker must print)
        "unknown element": ('<link name="paddle">', '<link name="paddle"><bogus_element>1</bogus_element>',
                            "bogus_element"),
        "joint to a missing link": ("<child>paddle</child>", "<child>no_such_link</child>", "no_such_link"),
        "value out of range": ("<horizontal_fov>0.1</horizontal_fov>", "<horizontal_fov>9</horizontal_fov>",
                               "horizontal_fov"),
    }
    for what, (old, new, needle) in cases.items():
        r = sdf_check(checker, [_break(out, tmp_path, old, new)], out / "models")
        assert r.returncode == 1 and needle in r.stderr, (what, r.stdout, r.stderr)
    r = sdf_check(checker, [out / "world.sdf"], None)           # model:// includes cannot be found
    assert r.returncode == 1 and "model://qc_part_0000" in r.stderr, r.stderr


# ---- what the world contains --------------------------------------------------------------------

def test_world_holds_the_described_cell(run):
    out, plan = run
    root = world_root(out)
    assert root.get("version") == "1.9"
    world = root.find("world")
    assert world.get("name") == WORLD
    systems = {p.get("name") for p in world.findall("plugin")}
    assert systems == {"gz::sim::systems::Physics", "gz::sim::systems::UserCommands",
                       "gz::sim::systems::SceneBroadcaster", "gz::sim::systems::Sensors"}
    models = {m.get("name"): m for m in world.findall("model")}
    assert set(models) == {"conveyor", "reject_bin", "qc_camera", "table", "arm", "pick_camera"}
    joints = {j.get("name"): j for j in models["conveyor"].findall("joint")}
    assert joints["belt"].get("type") == "prismatic" and joints["belt"].findtext("axis/xyz") == "1 0 0"
    travel = scene.PUSHER_REACH_Y_M - scene.PUSHER_REST_Y_M
    assert float(joints["pusher"].findtext("axis/limit/upper")) == pytest.approx(travel)
    arm = [(j.get("name"), j.get("type"), j.findtext("axis/xyz")) for j in models["arm"].findall("joint")][1:]
    described = [(b.joint.name, b.joint.axis) for b in scene.arm().walk() if b.joint]
    assert [a[0] for a in arm] == [d[0] for d in described] == [*scene.ARM_JOINTS, *scene.FINGER_JOINTS]
    assert [a[1] for a in arm] == ["revolute"] * 6 + ["prismatic"] * 2
    assert [tuple(map(float, a[2].split())) for a in arm] == [d[1] for d in described]
    included = [i.findtext("uri") for i in world.findall("include")]
    assert included == [f"model://{n}" for n in plan["in_world_file"]]
    assert included[0] == "model://qc_part_0000" and len(included) == 1 + len(plan["pick_scenes"][0]["objects"])


def _gz(topic: str) -> str:
    return topic if topic.startswith("/") else "/" + topic


def world_topics(root: ET.Element) -> tuple[set, set]:
    """(topics the world publishes, topics it subscribes), as gz-sim's systems name them."""
    world = root.find("world")
    published, consumed = {f"/world/{world.get('name')}/clock"}, set()
    for sensor in world.iter("sensor"):
        image = _gz(sensor.findtext("topic"))
        published |= {image, image.rsplit("/", 1)[0] + "/camera_info"}
    for model in world.findall("model"):
        name = model.get("name")
        for p in model.findall("plugin"):
            kind, joints = p.get("name").rsplit("::", 1)[1], [j.text for j in p.findall("joint_name")]
            if kind == "JointStatePublisher":
                published.add(p.findtext("topic") or f"/world/{world.get('name')}/model/{name}/joint_state")
            elif kind == "JointPositionController":
                consumed |= {f"/model/{name}/joint/{j}/0/cmd_pos" for j in joints}
            elif kind == "TrackController":
                consumed.add(f"/model/{name}/link/{p.findtext('link')}/track_cmd_vel")
    return published, consumed


def test_every_bridged_gazebo_topic_is_in_the_world(run):
    published, consumed = world_topics(world_root(run[0]))
    for e in BRIDGE:
        side = published if e["direction"] == "GZ_TO_ROS" else consumed
        assert _gz(e["gz_topic_name"]) in side, e
    # and every controller input of the world has a ROS topic
    assert consumed <= {_gz(e["gz_topic_name"]) for e in BRIDGE if e["direction"] == "ROS_TO_GZ"}


def node_topics() -> tuple[dict, dict, dict]:
    """(subscriptions, publications, side streams read per task) of the coprocessor node, from its
    interface tables (sol_control/ros/inputs.py, ros/outputs.py), as "package/msg/Type" names."""
    from sol_control.ros.inputs import SUBSCRIBED
    from sol_control.ros.outputs import OUTPUTS
    from sol_control.ros.side_streams import SIDE_READS

    def name(kind) -> str:
        return f"{kind.__module__.split('.')[0]}/msg/{kind.__name__}"

    return ({t: name(k) for t, k in SUBSCRIBED.items()}, {t: name(k) for t, k in OUTPUTS.values()}, SIDE_READS)


def launch_coprocessors(path: Path) -> dict:
    """task → {camera/image_raw: remapped topic} of the coprocessor nodes in a Python launch file."""
    tree = ast.parse(path.read_text())
    func = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "coprocessor")
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "coprocessor"]
    cameras = ast.literal_eval(next(n.value for n in tree.body if isinstance(n, ast.Assign)
                                    and n.targets[0].id == "CAMERAS"))
    assert "remappings" in ast.unparse(func)
    return {c.args[0].value: {"camera/image_raw": f"{cameras[c.args[0].value]}/camera/image_raw"} for c in calls}


# ros_gz_bridge's message pairs for the types we bridge (ros_gz_bridge README)
GZ_TYPE = {"rosgraph_msgs/msg/Clock": "gz.msgs.Clock", "sensor_msgs/msg/Image": "gz.msgs.Image",
           "sensor_msgs/msg/CameraInfo": "gz.msgs.CameraInfo", "sensor_msgs/msg/JointState": "gz.msgs.Model",
           "std_msgs/msg/Float64": "gz.msgs.Double"}


def test_bridge_gives_the_coprocessors_what_they_read():
    subs, pubs, side = node_topics()
    assert subs["camera/image_raw"] == "sensor_msgs/msg/Image" and side == {"qc": ("conveyor/joint_states",),
                                                                            "grasp": ("joint_states",)}
    to_ros = {e["ros_topic_name"]: e["ros_type_name"] for e in BRIDGE if e["direction"] == "GZ_TO_ROS"}
    for e in BRIDGE:
        assert GZ_TYPE[e["ros_type_name"]] == e["gz_type_name"], e
    nodes = launch_coprocessors(REPO / "launch" / "gazebo_cell.launch.py")
    assert set(nodes) == {"qc", "grasp"}
    for task, remap in nodes.items():
        needed = {remap.get(t, t): subs[t] for t in ("camera/image_raw", *side[task])}
        for topic, kind in needed.items():
            assert to_ros.get(topic) == kind, (task, topic, kind)
    # decisions stay ROS-side: nothing bridged collides with what the nodes publish
    assert not set(pubs) & {e["ros_topic_name"] for e in BRIDGE}
    assert all(e["ros_topic_name"].startswith("cell/") for e in BRIDGE if e["direction"] == "ROS_TO_GZ")


# ---- cameras ------------------------------------------------------------------------------------

def _sdf_camera(root: ET.Element, name: str) -> dict:
    world = root.find("world")
    model = next(m for m in world.findall("model") if m.get("name") == name)
    pose = model.find("pose")
    values = np.array(pose.text.split(), float)
    frame = np.zeros(3)
    if pose.get("relative_to"):
        f = next(f for f in world.findall("frame") if f.get("name") == pose.get("relative_to"))
        frame = np.array(f.findtext("pose").split(), float)[:3]
    assert pose.get("rotation_format") == "quat_xyzw"
    rot = np.zeros(9)
    mujoco.mju_quat2Mat(rot, np.r_[values[6], values[3:6]])
    cam = model.find("link/sensor/camera")
    return {"pos": values[:3] + frame, "rot": rot.reshape(3, 3), "size": (int(cam.findtext("image/width")),
            int(cam.findtext("image/height"))), "fx": float(cam.findtext("lens/intrinsics/fx")),
            "fy": float(cam.findtext("lens/intrinsics/fy")), "cx": float(cam.findtext("lens/intrinsics/cx")),
            "cy": float(cam.findtext("lens/intrinsics/cy")), "near": float(cam.findtext("clip/near"))}


def _project(c: dict, p: np.ndarray) -> np.ndarray:
    """Pinhole of a gz camera (x forward, y left, z up) → continuous pixels (u right, v down)."""
    local = (p - c["pos"]) @ c["rot"]                  # [N, 3] in the camera frame
    return np.c_[c["cx"] - c["fx"] * local[:, 1] / local[:, 0], c["cy"] - c["fy"] * local[:, 2] / local[:, 0]]


@pytest.mark.sim
@pytest.mark.parametrize("station", ["qc", "pick"])
def test_cameras_match_the_mujoco_cameras(run, station):
    root = world_root(run[0])
    c = _sdf_camera(root, f"{station}_camera")
    model = mujoco.MjModel.from_xml_string(scene.build_qc_mjcf(0.5) if station == "qc" else scene.build_pick_mjcf())
    i = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, station)
    size, to_px = (QC_IMAGE_PX, qc_m_to_px) if station == "qc" else (GRASP_IMAGE_PX, grasp_m_to_px)
    assert model.cam_projection[i] == mujoco.mjtProjection.mjPROJ_ORTHOGRAPHIC
    offset = np.zeros(3) if station == "qc" else np.asarray(scene.PICK_TABLE_IN_WORLD_M)
    mj_pos = model.cam_pos0[i] + offset
    mj_rot = model.cam_mat0[i].reshape(3, 3)           # columns: image right, image up, backward
    assert c["size"] == (size, size) and c["cx"] == c["cy"] == size / 2
    # same optical axis and look-down orientation; the near plane at the MuJoCo camera's height
    assert np.allclose(c["pos"][:2], mj_pos[:2]) and np.allclose(c["rot"][:, 0], -mj_rot[:, 2])
    assert np.allclose(c["rot"][:, 2], mj_rot[:, 1]) and np.allclose(-c["rot"][:, 1], mj_rot[:, 0])
    assert c["pos"][2] - c["near"] == pytest.approx(mj_pos[2])
    # view extent: fovy metres of the station surface over the image side
    assert c["fx"] == c["fy"] and size / (c["fx"] / c["pos"][2]) == pytest.approx(model.cam_fovy[i], rel=1e-12)
    # where metres land: exactly on the surface, < 0.1 px up to the tallest object (7 cm)
    grid = np.linspace(-1, 1, 9) * model.cam_fovy[i] / 2
    xy = np.stack(np.meshgrid(grid, grid), -1).reshape(-1, 2)          # [81, 2] over the whole view
    expected = np.array([to_px(x, y) for x, y in xy])
    for h_m, tol_px in ((0.0, 1e-6), (0.01, 0.02), (0.07, 0.1)):
        got = _project(c, np.c_[xy, np.full(len(xy), h_m)] + offset)
        assert np.abs(got - expected).max() < tol_px, (h_m, np.abs(got - expected).max())


def _as_pinhole(model, cam_name: str, c: dict, standoff_m: float | None = None) -> None:
    """Turn MuJoCo camera `cam_name` into the SDF camera `c` (or one at standoff_m, same view)."""
    i = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, cam_name)
    pos, fx, near = c["pos"].copy(), c["fx"], c["near"]
    if standoff_m is not None:                         # negative control: a pinhole close to the table
        fx, near, pos[2] = fx * standoff_m / pos[2], 0.01, standoff_m
    quat = np.zeros(4)
    mujoco.mju_mat2Quat(quat, (c["rot"] @ sdf.GZ_FROM_MJ_CAMERA.T).ravel())
    model.cam_projection[i] = mujoco.mjtProjection.mjPROJ_PERSPECTIVE
    model.cam_fovy[i] = np.degrees(2 * np.arctan(c["size"][0] / 2 / fx))
    model.cam_pos[i], model.cam_quat[i] = pos, quat
    model.vis.map.znear, model.vis.map.zfar = near / model.stat.extent, (pos[2] + 1.0) / model.stat.extent


@pytest.mark.sim
def test_mujoco_renders_the_same_images_through_the_sdf_cameras(run):
    """MuJoCo's renderer, given each SDF camera's pose, focal length and clip planes, draws the
    image its own orthographic camera draws (only anti-aliased edges differ); a pinhole at the
    MuJoCo camera's height with the same view on the table does not."""
    from sol_control.sim.cell import Cell
    from sol_control.sim.config import CellConfig

    root = world_root(run[0])
    cams = {s: _sdf_camera(root, f"{s}_camera") for s in ("qc", "pick")}
    cams["pick"]["pos"] = cams["pick"]["pos"] - np.asarray(scene.PICK_TABLE_IN_WORLD_M)   # MuJoCo: own model
    cell = Cell(CellConfig(seed=2))
    images = {}
    while len(images) < 2:
        for e in cell.step_until_event(10.0):
            station = {"qc_trigger": "qc", "pick_trigger": "pick"}[e["type"]]
            if station in images:
                continue
            model, data = (cell.qc_model, cell.qc_data) if station == "qc" else (cell.pick.model, cell.pick.data)
            render = cell.render_qc if station == "qc" else cell.render_pick
            shots = [render()]
            for standoff in (None, PICK_CONTROL_STANDOFF_M):
                _as_pinhole(model, station, cams[station], standoff)
                mujoco.mj_camlight(model, data)
                shots.append(render())
            images[station] = shots
    cell.close()
    for station, (ortho, pinhole, near_pinhole) in images.items():
        diff = np.abs(ortho.astype(int) - pinhole.astype(int))
        assert diff.mean() < 0.1 and (diff.max(axis=2) > 0).mean() < 0.02, (station, diff.mean())
        if station == "pick":                          # objects stand up to 7 cm off the table
            control = np.abs(ortho.astype(int) - near_pinhole.astype(int))
            assert control.mean() > 10 * max(diff.mean(), 0.01), (control.mean(), diff.mean())


# ---- per-run parts and scenes -------------------------------------------------------------------

@pytest.mark.sim
def test_parts_and_scenes_are_the_mujoco_cells(run):
    """Same seed → the parts the MuJoCo conveyor spawns (time, spec, yaw, padded plate, texture
    bytes) and the scenes its pick station lays out."""
    from sol_control.sim.cell import Cell
    from sol_control.sim.config import CellConfig

    out, plan = run
    cell = Cell(CellConfig(seed=plan["seed"]), render=False)
    seen, scenes = {}, {}
    while cell.time_s < plan["duration_s"]:
        cell.step()
        conveyor = cell.conveyor
        for bp in conveyor.parts:
            if bp.part_id not in seen:
                g, t = conveyor.geom[bp.slot], conveyor.tex[bp.slot]
                adr, px = conveyor.model.tex_adr[t], scene.PART_TEXTURE_PX
                seen[bp.part_id] = (bp.spawn_t_s, bp.part, float(conveyor.model.geom_size[g][0]),
                                    conveyor.model.tex_data[adr:adr + px * px * 3].reshape(px, px, 3).copy())
        if cell.pick.scene is not None:
            scenes.setdefault(cell.pick.scene_id, cell.pick.scene)
    assert len(seen) == len(plan["qc_parts"]) >= 6
    for k, entry in enumerate(plan["qc_parts"]):
        t_s, part, half_m, texture = seen[k]
        assert entry["spawn_t_s"] == pytest.approx(t_s, abs=1e-9) and entry["defect"] == part.defect
        assert entry["size_m"] == part.size_m and entry["quat_wxyz"][3] == pytest.approx(np.sin(part.yaw_rad / 2))
        assert padded_half_m(part.size_m) == pytest.approx(half_m, rel=1e-6)     # MuJoCo stores float32
        png = mujoco_free_imread(out / "models" / entry["model"] / "top.png")
        assert np.array_equal(png, texture)
        quad = np.loadtxt([ln[2:] for ln in (out / "models" / entry["model"] / "top.obj").read_text().splitlines()
                           if ln.startswith("v ")])
        assert np.abs(quad[:, :2]).max() == pytest.approx(half_m, abs=1e-6)
    for s, entry in enumerate(plan["pick_scenes"][:len(scenes)]):
        objects = scenes[s].objects
        assert [o["shape"] for o in entry["objects"]] == [ob.shape for ob in objects]
        assert [o["pos_pick_table_m"][:2] for o in entry["objects"]] == [[ob.x_m, ob.y_m] for ob in objects]


def mujoco_free_imread(path: Path) -> np.ndarray:
    import cv2

    return cv2.imread(str(path), cv2.IMREAD_COLOR)[..., ::-1]           # BGR file → RGB [P, P, 3]


def test_schedules_follow_the_seed():
    a, b = qc_schedule(4, ConveyorConfig(), 8.0), qc_schedule(4, ConveyorConfig(), 8.0)
    c = qc_schedule(5, ConveyorConfig(), 8.0)
    assert [(t, p.spec) for t, p in a] == [(t, p.spec) for t, p in b] != [(t, p.spec) for t, p in c]
    fast = qc_schedule(4, ConveyorConfig(belt_speed_mps=0.4), 8.0)
    assert len(fast) > len(a)                                          # pitch in metres: more parts
    assert pick_scenes(4, 2)[1].objects[0].x_m == pick_scenes(4, 3)[1].objects[0].x_m


@pytest.mark.sim
def test_link_inertials_are_the_mass_properties_mujoco_compiles(run):
    out, _ = run
    for seed in (0, 1, 4):
        sc = pick_scenes(seed, 1)[0]
        st = scene.pick_station(sc.objects)
        model = mujoco.MjModel.from_xml_string(scene.build_pick_mjcf(sc.objects))
        meshes = {m.name: m for ob in st.objects for m in ob.meshes}
        for body in [ob.body for ob in st.objects] + list(st.arm.walk()):
            b = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, body.name)
            p = body_props(body, meshes)
            assert p.mass_kg == pytest.approx(model.body_mass[b], rel=1e-6), body.name
            assert np.allclose(p.com_m, model.body_ipos[b], atol=1e-7), body.name
            assert np.allclose(np.sort(np.linalg.eigvalsh(p.inertia)), np.sort(model.body_inertia[b]),
                               rtol=1e-6, atol=1e-12), body.name
    # and the world file carries them
    link2 = next(ln for ln in world_root(out).iter("link") if ln.get("name") == "link2")
    described = body_props(next(b for b in scene.arm().walk() if b.name == "link2"))
    assert float(link2.findtext("inertial/mass")) == pytest.approx(described.mass_kg, rel=1e-8)
    assert float(link2.findtext("inertial/inertia/ixx")) == pytest.approx(described.inertia[0, 0], rel=1e-8)


def test_irregular_objects_collide_with_their_convex_hull(tmp_path):
    plan = write_run(tmp_path, seed=1, duration_s=2.0, n_scenes=4)
    irregular = [o for s in plan["pick_scenes"] for o in s["objects"] if o["shape"] == "irregular"]
    assert irregular
    for o in irregular:
        folder = tmp_path / "models" / o["model"]
        model = ET.parse(folder / "model.sdf").getroot()
        uris = {e.tag: e.findtext("geometry/mesh/uri") for e in model.iter() if e.tag in ("collision",)}
        hull_file = folder / uris["collision"].rsplit("/", 1)[1]
        mesh = np.loadtxt([ln[2:] for ln in (folder / hull_file.name.replace("_hull", "")).read_text().splitlines()
                           if ln.startswith("v ")])
        hull = np.loadtxt([ln[2:] for ln in hull_file.read_text().splitlines() if ln.startswith("v ")])
        ring = hull[: (len(hull) - 2) // 2, :2]                       # bottom ring, counter-clockwise
        edges = np.roll(ring, -1, axis=0) - ring
        rel = mesh[:, None, :2] - ring[None]                            # [V, H, 2]
        inside = edges[None, :, 0] * rel[..., 1] - edges[None, :, 1] * rel[..., 0] >= -1e-9     # [V, H]
        assert inside.all(), o["model"]


def test_cli_writes_a_run_and_refuses_bad_settings(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "r"), "--seed", "2", "--duration", "3", "--scenes", "1"]) == 0
    assert (tmp_path / "r" / "world.sdf").is_file() and (tmp_path / "r" / "spawn_plan.json").is_file()
    assert "gz sim" in capsys.readouterr().out
    with pytest.raises(ValueError, match="belt_speed_mps"):
        main(["--out", str(tmp_path / "x"), "--belt-speed", "-1"])
    with pytest.raises(ValueError, match="duration_s"):
        write_run(tmp_path / "y", seed=1, duration_s=0.0)
    shutil.rmtree(tmp_path / "r")
