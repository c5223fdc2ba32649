"""Benchmarks: decoder, node, end to end, peers, soak."""
