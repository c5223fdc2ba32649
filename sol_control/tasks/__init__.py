"""Procedural QC and grasp tasks (numpy + OpenCV, deterministic by seed)."""
