"""MuJoCo robot cell: a conveyor QC line and a pick station with a 6-DoF arm.

ROS-free except `bridge.py` (the `cell_sim` node) and `demo.py` (which starts ROS processes).
"""
