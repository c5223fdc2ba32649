"""Decoder graphs written from plain weights (no torch)."""
