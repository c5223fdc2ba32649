"""Launch the sol_control co-processor (a lifecycle node that configures and activates itself).

    ros2 launch sol_control coprocessor.launch.py namespace:=cell1 params_file:=/path/params.yaml

Arguments: namespace, params_file (default: the package's config/sol_control.yaml), autostart
(false: leave the transitions to a lifecycle manager), dds_profile (Fast DDS XML profile exported as
FASTDDS_DEFAULT_PROFILES_FILE; default: the package's shared-memory + loopback profile).
A node that dies is started again after RESPAWN_DELAY_S; with autostart it configures and
activates itself (docs/RELIABILITY.md, "The coprocessor killed").
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, SetEnvironmentVariable
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode
from launch_ros.substitutions import FindPackageShare

RESPAWN_DELAY_S = 0.5


def generate_launch_description() -> LaunchDescription:
    share = FindPackageShare("sol_control")
    namespace = LaunchConfiguration("namespace")
    params_file = LaunchConfiguration("params_file")
    autostart = LaunchConfiguration("autostart")
    dds_profile = LaunchConfiguration("dds_profile")
    return LaunchDescription([
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node and its topics"),
        DeclareLaunchArgument("params_file", default_value=PathJoinSubstitution([share, "config", "sol_control.yaml"]),
                              description="ROS 2 params file for node sol_control"),
        DeclareLaunchArgument("autostart", default_value="true",
                              description="configure + activate at start (false: use a lifecycle manager)"),
        DeclareLaunchArgument("dds_profile", default_value=PathJoinSubstitution([share, "config", "fastdds_localhost.xml"]),
                              description="Fast DDS XML profile (shared memory + loopback UDP by default)"),
        SetEnvironmentVariable("FASTDDS_DEFAULT_PROFILES_FILE", dds_profile),
        LifecycleNode(
            package="sol_control",
            executable="coprocessor",
            name="sol_control",
            namespace=namespace,
            parameters=[params_file, {"autostart": autostart}],
            output="screen",
            respawn=True,
            respawn_delay=RESPAWN_DELAY_S,
        ),
    ])
