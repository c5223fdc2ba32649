"""The speculative decoding engine: ONNX Runtime decoders with preallocated KV caches (no ROS)."""
from .adaptive_k import AdaptiveK, GuessLength
from .session import DecoderSession, open_decoder, session_options
from .speculative import DecodeResult, DecodeStats, greedy, sample, speculate, speculate_heads, tokens_per_s

__all__ = ["AdaptiveK", "DecodeResult", "DecodeStats", "DecoderSession", "GuessLength", "greedy", "sample",
           "open_decoder", "session_options", "speculate", "speculate_heads", "tokens_per_s"]
