"""The simulated cell (MuJoCo, `cell_sim`) with one co-processor per camera, as `make demo` runs it.

    ros2 launch sol_control sim_demo.launch.py seed:=3 params_file:=/path/params.yaml

The QC co-processor (node sol_control_qc, mode qc) reads qc/camera/image_raw; the grasp
co-processor (node sol_control_grasp, mode grasp) reads pick/camera/image_raw. Both run on the
cell's /clock (use_sim_time). Arguments: seed, params_file, dds_profile.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.substitutions import FindPackageShare

CAMERAS = {"qc": "qc", "grasp": "pick"}
RESPAWN_DELAY_S = 0.5      # a node that dies is started again (autostart: configured and active)


def coprocessor(task: str, params_file) -> LifecycleNode:
    return LifecycleNode(
        package="sol_control",
        executable="coprocessor",
        name=f"sol_control_{task}",
        namespace="",
        parameters=[params_file, {"mode": task, "use_sim_time": True, "autostart": True,
                                  "deadline.sensor_timeout_ms": 600000.0}],
        remappings=[("camera/image_raw", f"{CAMERAS[task]}/camera/image_raw")],
        output="screen",
        respawn=True,
        respawn_delay=RESPAWN_DELAY_S,
    )


def generate_launch_description() -> LaunchDescription:
    share = FindPackageShare("sol_control")
    params_file = LaunchConfiguration("params_file")
    return LaunchDescription([
        DeclareLaunchArgument("seed", default_value="1", description="cell seed (same seed, same parts)"),
        DeclareLaunchArgument("params_file", default_value=PathJoinSubstitution([share, "config", "sol_control.yaml"]),
                              description="ROS 2 params file for the co-processors"),
        DeclareLaunchArgument("dds_profile", default_value=PathJoinSubstitution([share, "config", "fastdds_localhost.xml"]),
                              description="Fast DDS XML profile (shared memory + loopback UDP by default)"),
        SetEnvironmentVariable("FASTDDS_DEFAULT_PROFILES_FILE", LaunchConfiguration("dds_profile")),
        Node(package="sol_control", executable="cell_sim", name="cell_sim",
             parameters=[{"mode": "realtime", "cell.seed": LaunchConfiguration("seed")}], output="screen"),
        coprocessor("qc", params_file),
        coprocessor("grasp", params_file),
    ])
