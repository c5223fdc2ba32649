"""The ROS 2 layer: the only part of sol_control that imports rclpy.

node.py (the lifecycle node `sol_control`), convert.py (messages <-> core types, in round-trip pairs),
qos.py (the QoS profiles of inputs and outputs).
"""
