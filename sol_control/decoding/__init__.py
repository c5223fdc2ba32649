"""The speculative decoding engine: decoders with preallocated KV caches (no ROS).

    decoder.py    Decoder: what a decoder is (the Protocol everything here is written against)
    session.py    DecoderSession: the Optimum decoder-with-past layout on ONNX Runtime
    fused.py      FusedDecoderSession: the fused layout (graph.llama), draft heads, on ONNX Runtime
    native.py     NativeDecoderSession: the fused layout's pass in C (sol_control/native)
    backend_choice.py, factory.py   open_decoder: the session, backend and precision for a bundle
    speculative.py (sampling.py, adaptive_k.py, guesses.py)   greedy, speculate, speculate_heads
"""
from .adaptive_k import AdaptiveK, GuessLength
from .decoder import Decoder
from .factory import open_decoder
from .session import DecoderSession, session_options
from .speculative import DecodeResult, DecodeStats, greedy, sample, speculate, speculate_heads, tokens_per_s

__all__ = ["AdaptiveK", "DecodeResult", "DecodeStats", "Decoder", "DecoderSession", "GuessLength", "greedy",
           "open_decoder", "sample", "session_options", "speculate", "speculate_heads", "tokens_per_s"]
