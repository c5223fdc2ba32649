"""The Gazebo cell with one co-processor per camera: `gz sim`, ros_gz_bridge and the two nodes.

    python -m sol_control.sim.gazebo_world --out /tmp/gz_run --seed 1     # write the world first
    ros2 launch sol_control gazebo_cell.launch.py world_dir:=/tmp/gz_run

`gz sim` runs world_dir/world.sdf with world_dir/models on GZ_SIM_RESOURCE_PATH (server only and
headless unless gz_args says otherwise); ros_gz_bridge maps its clock, cameras and joint states with
the package's config/gz_bridge.yaml; after `belt_start_s` the belt surface is set moving at
`belt_speed_mps` (must equal the world's, written by gazebo_world --belt-speed). The QC
co-processor (sol_control_qc, mode qc) reads qc/camera/image_raw, the grasp co-processor
(sol_control_grasp, mode grasp) reads pick/camera/image_raw, both on the simulator's /clock, as in
sim_demo.launch.py. Executing decisions (pusher, gripper, arm) is a cell controller's job:
docs/GAZEBO.md maps it.
"""
from launch import LaunchDescription
from launch.actions import (AppendEnvironmentVariable, DeclareLaunchArgument, ExecuteProcess, SetEnvironmentVariable,
                            TimerAction)
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.substitutions import FindPackageShare

CAMERAS = {"qc": "qc", "grasp": "pick"}
RESPAWN_DELAY_S = 0.5      # a node that dies is started again (autostart: configured and active)
BELT_TOPIC = "/model/conveyor/link/frame/track_cmd_vel"


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
    world_dir = LaunchConfiguration("world_dir")
    return LaunchDescription([
        DeclareLaunchArgument("world_dir", description="folder written by `python -m sol_control.sim.gazebo_world`"),
        DeclareLaunchArgument("gz_args", default_value="-s --headless-rendering",
                              description="extra `gz sim` options (empty: with the GUI)"),
        DeclareLaunchArgument("belt_speed_mps", default_value="0.2",
                              description="belt surface speed; the world's --belt-speed"),
        DeclareLaunchArgument("belt_start_s", default_value="3.0", description="wall seconds before the belt starts"),
        DeclareLaunchArgument("params_file", default_value=PathJoinSubstitution([share, "config", "sol_control.yaml"]),
                              description="ROS 2 params file for the co-processors"),
        DeclareLaunchArgument("bridge_file", default_value=PathJoinSubstitution([share, "config", "gz_bridge.yaml"]),
                              description="ros_gz_bridge topic mapping"),
        DeclareLaunchArgument("dds_profile", default_value=PathJoinSubstitution([share, "config", "fastdds_localhost.xml"]),
                              description="Fast DDS XML profile (shared memory + loopback UDP by default)"),
        SetEnvironmentVariable("FASTDDS_DEFAULT_PROFILES_FILE", LaunchConfiguration("dds_profile")),
        AppendEnvironmentVariable("GZ_SIM_RESOURCE_PATH", PathJoinSubstitution([world_dir, "models"])),
        ExecuteProcess(cmd=["gz", "sim", "-r", LaunchConfiguration("gz_args"),
                            PathJoinSubstitution([world_dir, "world.sdf"])], shell=True, output="screen"),
        Node(package="ros_gz_bridge", executable="parameter_bridge", name="gz_bridge",
             parameters=[{"config_file": LaunchConfiguration("bridge_file")}], output="screen"),
        TimerAction(period=LaunchConfiguration("belt_start_s"), actions=[
            ExecuteProcess(cmd=["gz", "topic", "-t", BELT_TOPIC, "-m", "gz.msgs.Double", "-p",
                                ["data: ", LaunchConfiguration("belt_speed_mps")]], output="screen")]),
        coprocessor("qc", LaunchConfiguration("params_file")),
        coprocessor("grasp", LaunchConfiguration("params_file")),
    ])
