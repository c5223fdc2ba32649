"""The image pump over real rclpy + Fast DDS: it alone takes the camera subscriptions' messages
(no executor spins them), survives a failing callback, and stops promptly."""
import pytest

from tests.ros_helpers import set_ros_env, wait_for

pytestmark = pytest.mark.ros

DOMAIN = 25


@pytest.fixture()
def ros():
    set_ros_env(DOMAIN)
    import rclpy
    from rclpy.context import Context

    ctx = Context()
    rclpy.init(context=ctx, domain_id=DOMAIN)
    node = rclpy.create_node("sol_control_pump_test", context=ctx)
    yield node
    node.destroy_node()
    ctx.try_shutdown()


def _pump(node, callback, errors):
    from sensor_msgs.msg import Image

    from sol_control.ros.image_pump import ImagePump
    from sol_control.ros.side_streams import Polled

    sub = node.create_subscription(Image, "camera/image_raw", lambda m: None, 10, callback_group=Polled())
    pub = node.create_publisher(Image, "camera/image_raw", 10)
    return ImagePump(node.context, [(sub, callback)], errors.append), pub


def _image(i: int):
    from sensor_msgs.msg import Image

    msg = Image(height=1, width=1, encoding="mono8", step=1, data=bytes([i]))
    msg.header.frame_id = f"frame{i}"
    return msg


def test_pump_delivers_images_with_message_info_without_any_executor(ros):
    got, errors = [], []
    pump, pub = _pump(ros, lambda msg, info: got.append((msg.header.frame_id, info)), errors)
    pump.start()
    try:
        assert wait_for(lambda: pub.get_subscription_count() > 0)
        for i in range(5):
            pub.publish(_image(i))
            assert wait_for(lambda: len(got) == i + 1, 5.0), f"image {i} not taken"
    finally:
        pump.stop()
    assert [f for f, _ in got] == [f"frame{i}" for i in range(5)]
    assert all(info["source_timestamp"] > 0 for _, info in got)  # the node computes transport time from it
    assert pump.taken == 5 and errors == []


def test_failing_callback_is_reported_and_the_pump_keeps_taking(ros):
    got, errors = [], []

    def callback(msg, info):
        if msg.header.frame_id == "frame0":
            raise ValueError("bad frame")
        got.append(msg.header.frame_id)

    pump, pub = _pump(ros, callback, errors)
    pump.start()
    try:
        assert wait_for(lambda: pub.get_subscription_count() > 0)
        pub.publish(_image(0))
        assert wait_for(lambda: errors, 5.0)
        pub.publish(_image(1))
        assert wait_for(lambda: got == ["frame1"], 5.0)
    finally:
        pump.stop()
    assert len(errors) == 1 and "ValueError: bad frame" in errors[0] and "camera/image_raw" in errors[0]


def test_stop_wakes_a_waiting_pump_by_its_guard(ros):
    from sensor_msgs.msg import Image

    from sol_control.ros.image_pump import ImagePump
    from sol_control.ros.side_streams import Polled

    sub = ros.create_subscription(Image, "camera/image_raw", lambda m: None, 10, callback_group=Polled())
    pump = ImagePump(ros.context, [(sub, lambda msg, info: None)], [].append, wake_s=3600.0)
    pump.start()
    waiting = pump._thread
    assert wait_for(lambda: pump.waits > 0)  # inside a wait that only the stop guard can end early
    pump.stop(timeout_s=5.0)
    assert not waiting.is_alive()
