"""The real lifecycle node over real rclpy + Fast DDS (shipped profile, localhost, own domain).

Most cases drive the node from a client node in this process; images also come from a separate
publisher process. Timing is never asserted: a case checks which path decided and that the node
counted what it refused and still decides the next good frame.
"""
import gc
import math
import time

import numpy as np
import pytest

from tests.ros_helpers import Harness, bundle_params, now_ns, run_publisher, wait_for

DOMAIN_QC, DOMAIN_GRASP, DOMAIN_LIFECYCLE, DOMAIN_SIM_TIME = 21, 22, 23, 24
BUNDLES = bundle_params()
assert BUNDLES is not None, "the shipped bundles models/qc and models/grasp are part of the repository"

BASE = {"decoding.warmup_runs": 2, "audit_rate": 0.0, "deadline.qc_ms": 300.0, "deadline.grasp_ms": 300.0,
        "deadline.max_staleness_ms": 1000.0, "deadline.output_deadline_ms": 300.0,
        "deadline.sensor_timeout_ms": 60000.0, "inputs.max_image_pixels": 640 * 480}


@pytest.fixture(scope="module")
def h():
    harness = Harness(DOMAIN_QC, {**(BUNDLES or {}), **BASE, "mode": "qc"})
    assert harness.wait_connected()
    yield harness
    harness.close()


def qc_image(i: int) -> np.ndarray:
    from sol_control.tasks.qc import make_sample

    return make_sample("test", i).image


def node_status(h) -> dict[str, str]:
    """The node's status key-values of the newest /diagnostics message."""
    return next(kv(s) for s in h.messages("diagnostics")[-1].status if s.name == "sol_control: node")


def kv(status) -> dict[str, str]:
    return {v.key: v.value for v in status.values}


def publish_good(h, i: int = 0, stamp_ns: int | None = None):
    from sol_control.ros.convert import image_to_ros

    h.pub_image.publish(image_to_ros(qc_image(i), stamp_ns or now_ns(h.client), "qc_camera"))


def decide_one(h, i: int = 0, timeout_s: float = 10.0) -> dict[str, str]:
    """Publish a good frame and return the verdict key-values that answer it."""
    before = h.count("qc")
    stamp = now_ns(h.client)
    publish_good(h, i, stamp)
    assert wait_for(lambda: any(kv(m)["stamp"] == str(stamp) for m in h.messages("qc")[before:]), timeout_s), \
        f"no verdict for frame {stamp}; rejected={dict(h.node.stats.rejected)}"
    return next(kv(m) for m in h.messages("qc")[before:] if kv(m)["stamp"] == str(stamp))


def set_params(h, **flat) -> list:
    from rclpy.parameter import Parameter

    return h.node.set_parameters([Parameter(k.replace("__", "."), value=v) for k, v in flat.items()])


# -- decisions ------------------------------------------------------------------------------------
@pytest.mark.ros
@pytest.mark.process
def test_images_from_another_process_produce_verdicts(h):
    before = h.count("qc")
    r = run_publisher(DOMAIN_QC, "--count", "6", "--rate-hz", "10", "--task", "qc")
    assert r.returncode == 0, r.stderr[-2000:]
    assert wait_for(lambda: h.count("qc") - before >= 4, 10.0), (h.count("qc") - before, dict(h.node.stats.rejected))
    for m in h.messages("qc")[before:]:
        v = kv(m)
        assert v["source"] in ("fast", "full_precision", "safe_default")
        assert v["verdict"] in ("pass", "reject", "uncertain") and m.level in (b"\x00", b"\x01", b"\x02")
        assert float(v["latency_ms"]) > 0 and v["deadline_met"] in ("true", "false") and int(v["stamp"]) > 0
        assert m.hardware_id == "qc_camera"


@pytest.mark.ros
def test_fast_path_decides_in_normal_operation(h):
    sources = [decide_one(h, i)["source"] for i in range(3)]
    assert "fast" in sources, sources


@pytest.mark.ros
def test_slow_fast_path_falls_back_to_full_precision(h):
    assert all(r.successful for r in set_params(h, deadline__qc_ms=600.0, deadline__fast_share=0.5,
                                                fault_injection__fast_delay_ms=400.0))
    try:
        v = decide_one(h, 1)
        assert v["source"] == "full_precision", v
        assert v["reason"] == "fast_over_budget" and v["deadline_met"] == "true"
    finally:
        set_params(h, deadline__qc_ms=300.0, deadline__fast_share=1.0, fault_injection__fast_delay_ms=0.0)


@pytest.mark.ros
def test_impossible_deadline_gives_safe_default(h):
    assert set_params(h, deadline__qc_ms=0.01)[0].successful
    try:
        v = decide_one(h, 2)
        assert v["source"] == "safe_default" and v["verdict"] == "uncertain" and v["defect"] == "unknown"
        assert v["deadline_met"] == "false"
    finally:
        set_params(h, deadline__qc_ms=300.0)
    assert decide_one(h, 3)["source"] != "safe_default"  # with its deadline back, the node decides again


@pytest.mark.ros
def test_stalled_planner_is_answered_by_the_watchdog_at_the_deadline(h):
    assert all(r.successful for r in set_params(h, deadline__qc_ms=150.0, fault_injection__fast_delay_ms=1500.0))
    try:
        watchdog = h.node.runners["qc"].watchdog
        before, discarded = h.count("qc"), watchdog.discarded
        stamp = now_ns(h.client)
        publish_good(h, 2, stamp)
        assert wait_for(lambda: any(kv(m)["stamp"] == str(stamp) for m in h.messages("qc")[before:]), 5.0)
        v = next(kv(m) for m in h.messages("qc")[before:] if kv(m)["stamp"] == str(stamp))
        # the watchdog answers only a step still running at its deadline: answered before the planner returned
        assert v["source"] == "safe_default" and v["reason"] == "watchdog", v
        assert wait_for(lambda: watchdog.discarded > discarded, 5.0)  # it returned; its answer was dropped
    finally:
        set_params(h, deadline__qc_ms=300.0, fault_injection__fast_delay_ms=0.0)
    decide_one(h, 3)  # one verdict topic keeps its order: a late answer would have arrived before this one
    assert sum(kv(m)["stamp"] == str(stamp) for m in h.messages("qc")[before:]) == 1


@pytest.mark.ros
def test_stale_frame_is_not_decided_and_counted(h):
    before_stale = h.node.stats.rejected_count("stale")
    before = h.count("qc")
    stale = now_ns(h.client) - 5_000_000_000  # 5 s old, max_staleness 1 s
    publish_good(h, 0, stale)
    assert wait_for(lambda: h.node.stats.rejected_count("stale") > before_stale, 5.0)
    decide_one(h, 4)  # the next frame's verdict: an answer to the stale one would have come first
    assert [kv(m)["stamp"] for m in h.messages("qc")[before:]].count(str(stale)) == 0


@pytest.mark.ros
def test_eject_time_from_conveyor(h):
    from sensor_msgs.msg import JointState

    from sol_control.ros.convert import stamp_to_ros

    belt = JointState(name=["belt"], position=[1.0], velocity=[0.25])
    belt.header.stamp = stamp_to_ros(now_ns(h.client))
    h.pub_conveyor.publish(belt)
    assert wait_for(lambda: h.node.inputs.side_streams.latest("conveyor/joint_states") is not None, 5.0)
    v = decide_one(h, 5)
    # part under the camera at the image stamp reaches the ejector 0.5 m / 0.25 m/s = 2 s later
    assert int(v["eject_time"]) - int(v["stamp"]) == pytest.approx(2_000_000_000, abs=2_000_000)


@pytest.mark.ros
def test_compressed_images_are_decided(h):
    from sol_control.ros.convert import compressed_to_ros

    before = h.count("qc")
    stamp = now_ns(h.client)
    h.pub_compressed.publish(compressed_to_ros(qc_image(6), stamp, "qc_camera", "png"))
    assert wait_for(lambda: any(kv(m)["stamp"] == str(stamp) for m in h.messages("qc")[before:]), 10.0)


# -- bad-input corpus -----------------------------------------------------------------------------
def _bad_image(case: str, stamp: int):
    from sensor_msgs.msg import CompressedImage

    from sol_control.ros.convert import image_to_ros, stamp_to_ros

    msg = image_to_ros(qc_image(0), stamp, "qc_camera")
    if case == "wrong_encoding":
        msg.encoding = "yuv422_yuy2"
    elif case == "step_mismatch":
        msg.step = msg.width * 3 - 1
    elif case == "size_mismatch":
        msg.data = bytes(msg.data) + b"\x00" * 7
    elif case == "truncated_data":
        msg.data = bytes(msg.data)[: len(msg.data) // 2]
    elif case == "empty_image":
        msg.height, msg.width, msg.step, msg.data = 0, 0, 0, b""
    elif case == "too_many_pixels":
        msg.height, msg.width, msg.step = 800, 800, 800 * 3  # 640,000 px > max_image_pixels 307,200
        msg.data = bytes(800 * 800 * 3)
    elif case == "future_stamp":
        msg.header.stamp = stamp_to_ros(stamp + 60_000_000_000)
    elif case == "ancient_stamp":
        msg.header.stamp = stamp_to_ros(1_000_000_000)
    elif case == "zero_stamp":
        msg.header.stamp = stamp_to_ros(0)
    elif case == "corrupt_jpeg":
        c = CompressedImage(format="jpeg", data=b"\xff\xd8\xff\xe0" + bytes(200))
        c.header.stamp = stamp_to_ros(stamp)
        return c
    return msg


CORPUS = [  # case, reason counted
    ("wrong_encoding", "encoding_unsupported"), ("step_mismatch", "step_mismatch"),
    ("size_mismatch", "size_mismatch"), ("truncated_data", "truncated_data"), ("empty_image", "empty_image"),
    ("too_many_pixels", "too_many_pixels"), ("future_stamp", "stamp_future"), ("ancient_stamp", "stale"),
    ("zero_stamp", "stamp_zero"), ("corrupt_jpeg", "corrupt_compressed"),
    ("nan_joints", "joints_nonfinite"), ("inf_joints", "joints_nonfinite"),
    ("joint_length_mismatch", "joints_length_mismatch"), ("nan_wrench", "wrench_nonfinite"),
]


@pytest.mark.ros
@pytest.mark.parametrize("case,reason", CORPUS, ids=[c for c, _ in CORPUS])
def test_bad_input_is_counted_and_next_good_frame_decided(h, case, reason):
    from geometry_msgs.msg import WrenchStamped
    from sensor_msgs.msg import JointState

    before = h.node.stats.rejected_count(reason)
    stamp = now_ns(h.client)
    if case.endswith("joints") or case == "joint_length_mismatch":
        pos = {"nan_joints": [0.1, math.nan], "inf_joints": [math.inf, 0.0], "joint_length_mismatch": [0.1]}[case]
        m = JointState(name=["j1", "j2"], position=pos)
        h.pub_joints.publish(m)
    elif case == "nan_wrench":
        m = WrenchStamped()
        m.wrench.force.z = math.nan
        h.pub_wrench.publish(m)
    elif case == "corrupt_jpeg":
        h.pub_compressed.publish(_bad_image(case, stamp))
    else:
        h.pub_image.publish(_bad_image(case, stamp))
    assert wait_for(lambda: h.node.stats.rejected_count(reason) > before, 10.0), dict(h.node.stats.rejected)
    v = decide_one(h, 7)  # alive, and the next good frame is decided
    assert v["source"] in ("fast", "full_precision", "safe_default")


@pytest.mark.ros
def test_sensor_timeout_publishes_safe_defaults_and_recovers(h):
    decide_one(h, 0)
    assert set_params(h, deadline__sensor_timeout_ms=300.0)[0].successful
    try:
        before = h.count("qc")
        assert wait_for(lambda: any(kv(m)["reason"] == "sensor_timeout" for m in h.messages("qc")[before:]), 5.0)
        v = next(kv(m) for m in h.messages("qc")[before:] if kv(m)["reason"] == "sensor_timeout")
        assert v["source"] == "safe_default" and v["verdict"] == "uncertain"
        assert wait_for(lambda: any(st.name == "sol_control: node" and st.level == b"\x02"
                                    for m in h.messages("diagnostics")[-3:] for st in m.status), 3.0)
        decide_one(h, 1)  # frames are back: decided again, timeout cleared
        assert not h.node.stats.sensor_timeout
    finally:
        set_params(h, deadline__sensor_timeout_ms=60000.0)


# -- parameters and diagnostics -------------------------------------------------------------------
@pytest.mark.ros
def test_bad_runtime_parameter_is_refused_with_reason_over_ros(h):
    from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
    from rcl_interfaces.srv import SetParameters

    cli = h.client.create_client(SetParameters, "/sol_control/set_parameters")
    assert cli.wait_for_service(timeout_sec=5.0)
    req = SetParameters.Request(parameters=[
        Parameter(name="limits.width_min_m", value=ParameterValue(type=ParameterType.PARAMETER_DOUBLE, double_value=0.5))])
    fut = cli.call_async(req)
    assert wait_for(fut.done, 5.0)
    res = fut.result().results[0]
    assert not res.successful and "width" in res.reason
    assert h.node.get_parameter("limits.width_min_m").value == 0.0 and h.node.cfg.limits.width_min_m == 0.0
    bad = set_params(h, mode="fast")[0]
    assert not bad.successful and "mode" in bad.reason and h.node.get_parameter("mode").value == "qc"
    out_of_range = set_params(h, audit_rate=3.0)[0]
    assert not out_of_range.successful and h.node.cfg.audit_rate == 0.0
    h.client.destroy_client(cli)


@pytest.mark.ros
def test_diagnostics_report_latency_rejections_and_deadline_misses(h):
    decide_one(h, 0)
    stale = h.node.stats.rejected_count("stale")
    publish_good(h, 1, now_ns(h.client) - 5_000_000_000)  # 5 s old: rejected and counted
    assert wait_for(lambda: h.node.stats.rejected_count("stale") > stale, 5.0)
    # the first report that counts it (the node's silence since then misses its offered deadline)
    assert wait_for(lambda: h.messages("diagnostics") and int(node_status(h).get("rejected.stale", 0)) > stale, 5.0)
    last = h.messages("diagnostics")[-1]
    by_name = {s.name: kv(s) for s in last.status}
    qc = by_name["sol_control: qc"]
    assert float(qc["latency_p50_ms"]) > 0 and int(qc["decisions"]) > 0 and 0 <= float(qc["deadline_hit_rate"]) <= 1
    from sol_control.decoding.native import library  # the fast path's backend: the C pass where it is built
    assert qc["fast_backend"] == ("native" if library() is not None else "onnxruntime")
    node = by_name["sol_control: node"]
    assert node["state"] == "active" and int(node["rejected.stale"]) > stale
    assert int(node["rejected_inputs"]) >= int(node["rejected.stale"])
    gc_before = int(node["gc.gen2.collections"])
    gc.collect()  # the node runs in this process: a full collection it must count
    assert wait_for(lambda: int(node_status(h)["gc.gen2.collections"])
                    > gc_before, 3.0)
    assert all(f"gc.gen{g}.pause_max_ms" in node for g in (0, 1, 2))
    assert wait_for(lambda: h.node.stats.offered_deadline_missed > 0, 5.0)


@pytest.mark.ros
def test_under_sim_time_a_frame_before_the_first_clock_is_decided():
    """A node respawned under sim time may get its first frame before the first /clock: its clock
    then reads 0, and the frame (stamped seconds into the simulation) is not "from the future"."""
    st = Harness(DOMAIN_SIM_TIME, {**(BUNDLES or {}), **BASE, "mode": "qc", "use_sim_time": True})
    try:
        assert st.wait_connected()
        assert st.node.get_clock().now().nanoseconds == 0  # nobody publishes /clock here
        stamp = 3_000_000_000
        publish_good(st, 0, stamp)
        assert wait_for(lambda: any(kv(m)["stamp"] == str(stamp) for m in st.messages("qc")), 10.0), \
            dict(st.node.stats.rejected)
        assert st.node.stats.rejected_count() == 0
    finally:
        st.close()


# -- grasp ----------------------------------------------------------------------------------------
@pytest.mark.ros
def test_grasp_decisions_with_joints():
    from sensor_msgs.msg import JointState

    from sol_control.ros.convert import image_to_ros, stamp_to_ros
    from sol_control.tasks.grasp import make_sample

    g = Harness(DOMAIN_GRASP, {**(BUNDLES or {}), **BASE, "mode": "grasp", "audit_rate": 1.0})
    try:
        assert g.wait_connected()
        side = g.node.inputs.side_streams
        for i in range(4):
            s = make_sample("test", i)
            j = JointState(name=[f"joint{k + 1}" for k in range(6)], position=[float(x) for x in s.joints_rad])
            j.header.stamp = stamp_to_ros(joints_ns := now_ns(g.client))
            g.pub_joints.publish(j)
            assert wait_for(lambda: getattr(side.latest("joint_states"), "stamp_ns", 0) == joints_ns, 5.0)
            before = g.count("grasp")
            g.pub_image.publish(image_to_ros(s.image, now_ns(g.client), "grasp_camera"))
            wait_for(lambda: g.count("grasp") > before, 5.0)
        assert g.count("grasp") >= 3, dict(g.node.stats.rejected)
        decisions = [kv(m) for m in g.messages("grasp")]
        grasps = [d for d in decisions if d["hold"] == "false"]
        assert grasps, decisions
        assert wait_for(lambda: g.count("pose") >= 1, 5.0)
        pose = g.messages("pose")[-1]
        assert pose.header.frame_id == "pick_table"
        assert -0.12 <= pose.pose.position.x <= 0.12 and 0.0 <= pose.pose.position.z <= 0.4
        # shadow audit: fast decisions recomputed at fp32 in the background, reported on /diagnostics
        if any(d["source"] == "fast" for d in decisions):
            assert wait_for(lambda: g.node.cop.stats()["grasp"]["audited"] >= 1, 10.0)
            assert wait_for(lambda: any(v.key == "audited" and int(v.value) >= 1 for m in g.messages("diagnostics")
                                        for st in m.status if st.name == "sol_control: grasp" for v in st.values), 5.0)
    finally:
        g.close()


# -- lifecycle ------------------------------------------------------------------------------------
def _change(client, transition_id: int) -> bool:
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState

    cli = client.create_client(ChangeState, "/sol_control/change_state")
    assert cli.wait_for_service(timeout_sec=5.0)
    fut = cli.call_async(ChangeState.Request(transition=Transition(id=transition_id)))
    assert wait_for(fut.done, 60.0)
    client.destroy_client(cli)
    return fut.result().success


def _state(client) -> str:
    from lifecycle_msgs.srv import GetState

    cli = client.create_client(GetState, "/sol_control/get_state")
    assert cli.wait_for_service(timeout_sec=5.0)
    fut = cli.call_async(GetState.Request())
    assert wait_for(fut.done, 10.0)
    client.destroy_client(cli)
    return fut.result().current_state.label


@pytest.mark.ros
def test_lifecycle_transitions_over_ros():
    from diagnostic_msgs.msg import DiagnosticStatus
    from lifecycle_msgs.msg import Transition
    from rclpy.qos import LivelinessPolicy

    from sol_control.ros.convert import image_to_ros
    from sol_control.ros.liveliness import DecisionWatch

    lc = Harness(DOMAIN_LIFECYCLE, {**(BUNDLES or {}), **BASE, "mode": "qc", "qc.bundle": "/nonexistent/bundle"},
                 autostart=False)
    try:
        c = lc.client
        assert _state(c) == "unconfigured"
        assert not _change(c, Transition.TRANSITION_CONFIGURE)  # bad bundle path: stays unconfigured
        assert _state(c) == "unconfigured" and "nonexistent" in lc.node.config_error
        assert wait_for(lambda: any("nonexistent" in s.message for m in lc.messages("diagnostics")
                                    for s in m.status), 3.0)
        good = (BUNDLES or {}).get("qc.bundle", "")
        assert set_params(lc, qc__bundle=good)[0].successful
        assert _change(c, Transition.TRANSITION_CONFIGURE) and _state(c) == "inactive"
        # a line controller's view (sol_control.ros.liveliness): no decision publisher until active
        changes: list[bool] = []
        watch = DecisionWatch(c, DiagnosticStatus, "qc/verdict", lambda m: None, 500.0, changes.append)
        assert c.count_publishers("qc/verdict") == 0 and not watch.alive
        assert _change(c, Transition.TRANSITION_ACTIVATE) and _state(c) == "active"
        assert wait_for(lambda: changes == [True], 10.0), changes       # the event arrives
        offered = c.get_publishers_info_by_topic("qc/verdict")[0].qos_profile
        assert offered.liveliness == LivelinessPolicy.AUTOMATIC
        assert offered.liveliness_lease_duration.nanoseconds == 500_000_000   # qos.liveliness_lease_ms
        assert wait_for(lambda: lc.pub_image.get_subscription_count() > 0, 5.0)
        # a frame every 0.1 s until one is decided (the node's side of the match settles)
        assert wait_for(lambda: lc.pub_image.publish(image_to_ros(qc_image(0), now_ns(c), "qc_camera"))
                        or lc.count("qc") >= 1, 10.0, period_s=0.1)
        assert _change(c, Transition.TRANSITION_DEACTIVATE) and _state(c) == "inactive"
        assert wait_for(lambda: changes == [True, False], 10.0), changes  # deactivated: gone at once
        n, slot = lc.count("qc"), lc.node.runners["qc"].frames
        puts = slot.puts
        lc.pub_image.publish(image_to_ros(qc_image(1), now_ns(c), "qc_camera"))
        assert wait_for(lambda: slot.puts > puts, 5.0)  # taken and offered to the stopped runner
        assert lc.count("qc") == n and slot.peek() is not None  # inactive: nothing decided or published
        assert _change(c, Transition.TRANSITION_CLEANUP) and _state(c) == "unconfigured"
        assert lc.node.cop is None
        assert _change(c, Transition.TRANSITION_UNCONFIGURED_SHUTDOWN) and _state(c) == "finalized"
    finally:
        lc.close()


# -- the shipped Fast DDS profile -----------------------------------------------------------------
def _udp_sockets_of_this_process() -> list[tuple[str, int]]:
    import os
    import socket
    import struct

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    with open("/proc/net/udp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[9] in inodes:
                hex_ip, hex_port = cols[1].split(":")
                ip = socket.inet_ntoa(struct.pack("<I", int(hex_ip, 16)))
                out.append((ip, int(hex_port, 16)))
    return out


@pytest.mark.ros
def test_fastdds_profile_loaded_and_rtps_ports_on_loopback_only(h):
    import os

    # this process maps the profile's 16 MiB shared-memory segment (the rmw default is 0.5 MiB)
    with open("/proc/self/maps") as f:
        mapped = {line.split()[-1] for line in f if "/dev/shm/fastdds_" in line}
    sizes = [os.path.getsize(p) for p in mapped if os.path.exists(p)]
    assert any(s >= 16 * 1024 * 1024 for s in sizes), sizes
    # every RTPS port of this domain (7400 + 250 * domain ... + 250) is bound to 127.0.0.1 only,
    # and nothing listens on the multicast discovery group
    lo, hi = 7400 + 250 * DOMAIN_QC, 7400 + 250 * (DOMAIN_QC + 1)
    socks = _udp_sockets_of_this_process()
    rtps = [(ip, port) for ip, port in socks if lo <= port < hi]
    assert rtps and all(ip == "127.0.0.1" for ip, _ in rtps), rtps
    assert not any(ip.startswith("239.") for ip, _ in socks), socks


# -- conversions: pairs, tested by round trip (no DDS needed) -------------------------------------
@pytest.mark.parametrize("encoding", ["rgb8", "bgr8", "rgba8", "bgra8"])
def test_image_round_trip(encoding):
    from sol_control.ros.convert import image_from_ros, image_to_ros, stamp_from_ros

    rgb = np.random.default_rng(0).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    msg = image_to_ros(rgb, 1_234_567_890_123, "cam", encoding)
    assert msg.step == 5 * (4 if encoding.endswith("a8") else 3) and stamp_from_ros(msg.header.stamp) == 1_234_567_890_123
    assert np.array_equal(image_from_ros(msg, 10_000), rgb)


def test_mono_and_padded_rows():
    from sol_control.ros.convert import image_from_ros, image_to_ros

    gray = np.repeat(np.arange(12, dtype=np.uint8).reshape(3, 4, 1), 3, axis=2)
    assert np.array_equal(image_from_ros(image_to_ros(gray, 1, "c", "mono8"), 100), gray)
    msg = image_to_ros(gray, 1, "c", "rgb8")
    rows = np.frombuffer(bytes(msg.data), np.uint8).reshape(3, 12)
    msg.step = 16  # rows padded to 16 bytes, as some drivers do
    msg.data = np.concatenate([rows, np.zeros((3, 4), np.uint8)], axis=1).tobytes()
    assert np.array_equal(image_from_ros(msg, 100), gray)


def test_joints_wrench_conveyor_round_trip():
    from sol_control.ros.side_streams import (conveyor_from_ros, conveyor_to_ros, joints_from_ros, joints_to_ros,
                                              wrench_from_ros, wrench_to_ros)
    from sol_control.telemetry import Conveyor, Joints, Wrench

    j = Joints(("a", "b"), np.array([0.1, -0.2]), np.array([0.0, 1.0]), 5)
    j2 = joints_from_ros(joints_to_ros(j), 100.0)
    assert j2.names == j.names and np.array_equal(j2.position_rad, j.position_rad) and j2.stamp_ns == 5
    w = Wrench(np.array([1.0, 2.0, 3.0]), np.array([0.1, 0.2, 0.3]), 7)
    w2 = wrench_from_ros(wrench_to_ros(w), 1e4)
    assert np.array_equal(w2.force_n, w.force_n) and np.array_equal(w2.torque_nm, w.torque_nm)
    c = Conveyor(1.5, 0.2, 9)
    assert conveyor_from_ros(conveyor_to_ros(c), 10.0) == c


def test_decisions_round_trip_through_status():
    from sol_control.actions import GraspDecision, QCVerdict, safe_default
    from sol_control.decision import Decision, Failure
    from sol_control.ros.convert import decision_from_status, decision_to_status, grasp_from_ros, grasp_to_ros

    qc = Decision("qc", QCVerdict("crack", "reject", 0.25, 0.75, 0.5, 0.875), "fast", 3.25, 10.0, True,
                  123456789, "qc_camera", eject_time_ns=987654321)
    s = decision_to_status(qc)
    assert s.level == b"\x02" and s.message == "reject: crack"
    back = decision_from_status(s)
    assert back.action == qc.action and back.source == "fast" and back.stamp_ns == qc.stamp_ns
    assert back.eject_time_ns == qc.eject_time_ns and back.deadline_met and back.latency_ms == pytest.approx(3.25)
    g = GraspDecision(0.01, -0.02, 0.03, 0.4, 0.05, 20.0, ((0.01, -0.02, 0.15), (0.01, -0.02, 0.09),
                                                           (0.01, -0.02, 0.05)), 0.75)
    d = Decision("grasp", g, "full_precision", 8.0, 10.0, True, 55, "grasp_camera",
                 fast_failure=Failure("fast_low_confidence"))
    s = decision_to_status(d)
    assert s.level == b"\x00" and decision_from_status(s).action == g
    assert decision_from_status(s).fast_failure == Failure("fast_low_confidence")
    both = Decision("qc", safe_default("qc"), "safe_default", 9.0, 10.0, True, 58, "",
                    fast_failure=Failure("fast_error", "ValueError"), full_failure=Failure("full_precision_would_miss"))
    kv = {v.key: v.value for v in decision_to_status(both).values}
    assert kv["reason"] == "fast_error:ValueError>full_precision_would_miss"  # the readable published form
    back = decision_from_status(decision_to_status(both))
    assert (back.fast_failure, back.full_failure) == (both.fast_failure, both.full_failure)
    m = grasp_to_ros(g, 55, "pick_table")
    g2 = grasp_from_ros(m, confidence=0.75)
    assert g2.yaw_rad == pytest.approx(g.yaw_rad) and g2.approach_m == g.approach_m and g2.width_m == g.width_m
    hold = Decision("grasp", safe_default("grasp"), "safe_default", 12.0, 10.0, False, 56, "",
                    fast_failure=Failure("no_budget"))
    s = decision_to_status(hold)
    assert s.level == b"\x01" and decision_from_status(s).action.hold
    unsure = Decision("qc", safe_default("qc"), "safe_default", 12.0, 10.0, False, 57, "",
                      fast_failure=Failure("no_budget"))
    assert decision_to_status(unsure).level == b"\x01"


def test_random_image_messages_never_raise_anything_but_a_rejection():
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from sensor_msgs.msg import Image

    from sol_control.ros.convert import image_from_ros
    from sol_control.telemetry import InputRejected

    @settings(max_examples=300, deadline=None)
    @given(st.sampled_from(["rgb8", "bgr8", "mono8", "rgba8", "bgra8", "16UC1", "", "rgb8\x00"]),
           st.integers(0, 70), st.integers(0, 70), st.integers(0, 300), st.binary(max_size=4000))
    def check(encoding, h, w, step, data):
        msg = Image(height=h, width=w, step=step, encoding=encoding)
        msg.data = data
        try:
            out = image_from_ros(msg, 4096)
        except InputRejected:
            return
        assert out.shape == (h, w, 3) and out.dtype == np.uint8
    check()


# -- the executable itself ------------------------------------------------------------------------
@pytest.mark.ros
@pytest.mark.process
def test_entry_point_process_with_params_file_decides_and_exits_cleanly(tmp_path):
    """`ros2 run sol_control coprocessor --ros-args --params-file config/sol_control.yaml` as a
    separate process: the shipped params file loads with ROS types, the node autostarts, decides a
    frame from this process, and stops cleanly on SIGINT."""
    import signal
    import subprocess
    import sys

    from tests.ros_helpers import REPO, ros_env

    domain = 24
    extra = [a for k, v in {**(BUNDLES or {}), "mode": "qc", "decoding.warmup_runs": 2,
                            "deadline.qc_ms": 300.0}.items() for a in ("-p", f"{k}:={v}")]
    log = open(tmp_path / "node.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", "from sol_control.ros.node import main; main()", "--ros-args",
                             "--params-file", str(REPO / "config" / "sol_control.yaml"), *extra],
                            cwd=REPO, env=ros_env(domain), stdout=log, stderr=subprocess.STDOUT)
    try:
        import rclpy
        from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
        from rclpy.context import Context
        from sensor_msgs.msg import Image

        from sol_control.ros.convert import image_to_ros

        ctx = Context()
        rclpy.init(context=ctx, domain_id=domain)
        node = rclpy.create_node("entry_point_probe", context=ctx)
        verdicts, states = [], []
        node.create_subscription(DiagnosticStatus, "qc/verdict", verdicts.append, 10)
        node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: states.extend(
            v.value for s in m.status if s.name == "sol_control: node" for v in s.values if v.key == "state"), 10)
        pub = node.create_publisher(Image, "camera/image_raw", 10)
        from rclpy.executors import SingleThreadedExecutor

        ex = SingleThreadedExecutor(context=ctx)
        ex.add_node(node)

        def spin_until(pred, timeout_s):
            t0 = time.monotonic()
            while not pred() and time.monotonic() - t0 < timeout_s and proc.poll() is None:
                ex.spin_once(timeout_sec=0.05)
            return pred()
        assert spin_until(lambda: "active" in states, 60.0), (tmp_path / "node.log").read_text()[-2000:]
        assert spin_until(lambda: pub.get_subscription_count() > 0, 10.0)
        spin_until(lambda: False, 0.3)
        pub.publish(image_to_ros(qc_image(0), node.get_clock().now().nanoseconds, "qc_camera"))
        assert spin_until(lambda: len(verdicts) >= 1, 10.0), (tmp_path / "node.log").read_text()[-2000:]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0, (tmp_path / "node.log").read_text()[-2000:]
        ex.shutdown()
        node.destroy_node()
        ctx.try_shutdown()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


def test_node_stats_count_sources_fallbacks_and_safe_defaults():
    from rclpy.time import Time

    from sol_control.actions import QCVerdict, safe_default
    from sol_control.decision import Decision, Failure
    from sol_control.ros.diagnostics import NodeStats

    st = NodeStats()
    ok = QCVerdict("ok", "pass", 0.5, 0.5, 0.0, 0.9)
    for _ in range(97):
        st.record(Decision("qc", ok, "fast", 4.0, 10.0, True, 1, acceptance=0.8))
    st.record(Decision("qc", ok, "full_precision", 9.0, 10.0, True, 1,
                       fast_failure=Failure("fast_error", "InjectedFault")))
    st.record(Decision("qc", safe_default("qc"), "safe_default", 11.0, 10.0, False, 1,
                       fast_failure=Failure("fast_over_budget"), full_failure=Failure("full_precision_would_miss")))
    st.record(Decision("qc", safe_default("qc"), "safe_default", 12.0, 10.0, False, 1,
                       fast_failure=Failure("no_budget")))
    st.reject("stale")
    st.reject("stale")
    msg = st.to_msg(Time().to_msg(), "active", "", {"qc": {"audited": 3}}, superseded=5)
    by = {s.name: (s.level, kv(s)) for s in msg.status}
    level, qc = by["sol_control: qc"]
    assert qc["decisions"] == "100" and qc["source.fast"] == "97" and qc["source.safe_default"] == "2"
    assert qc["fallback.fast_error"] == "1" and qc["fallback.fast_over_budget"] == "1" and qc["fallback.no_budget"] == "1"
    assert qc["safe_default.full_precision_would_miss"] == "1" and qc["safe_default.no_budget"] == "1"
    assert float(qc["deadline_hit_rate"]) == pytest.approx(0.98) and qc["deadline_missed"] == "2"
    assert level == b"\x01"  # hit rate below 99.9 %: WARN
    assert float(qc["speculative_acceptance"]) == pytest.approx(0.8) and qc["audited"] == "3"
    level, node = by["sol_control: node"]
    assert level == b"\x00" and node["rejected.stale"] == "2" and node["superseded_frames"] == "5"
    err = st.to_msg(Time().to_msg(), "unconfigured", "ValueError: bundle missing", {}, 0)
    assert err.status[0].level == b"\x02" and "bundle missing" in err.status[0].message
