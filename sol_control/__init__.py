"""sol_control: ultrafast mode for a robot cell (ROS-free core; ROS layer in sol_control.ros)."""
__version__ = "0.1.0"
