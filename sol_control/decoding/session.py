"""One ONNX Runtime decoder with its KV cache, allocated once.

The decoder uses the decoder-with-past layout that Hugging Face Optimum exports for causal LMs:

    input_ids [1, T] int64, attention_mask [1, P+T] int64, position_ids [1, T] int64,
    past_key_values.{i}.key|value [1, H, P, D]  ->  logits [1, T, V], present.{i}.key|value [1, H, P+T, D]

The cache lives in two preallocated flat buffers per tensor (ping-pong). A call binds the valid
past of one buffer as input and the other buffer as the `present` output, so the model writes the
new cache in place and nothing is allocated per call. `rewind(n)` only moves an index; the next
call compacts the kept rows into the other buffer with one copy, no allocation.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnxruntime as ort

_I64, _F32 = np.dtype(np.int64), np.dtype(np.float32)
_PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
_PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")


def session_options(threads: int = 1) -> ort.SessionOptions:
    """Our sessions' options. With more than one intra-op thread the pool's workers spin between
    the nodes of a run (without it a 2-thread grasp decision took 23-30 % longer: docs/BENCHMARKS.md,
    "Session settings on 2 cores") but stop when the run returns (`session.force_spinning_stop`):
    left alone they spin on for ~40 ms after it, taking a core from whatever runs next, another
    session of the process or another process (SmolLM2 int4, 2 threads: a session's first calls
    after another's 11-15 ms instead of 6.2; "Spinning stops when a run returns" there)."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0" if threads == 1 else "1")
    opts.add_session_config_entry("session.force_spinning_stop", "0" if threads == 1 else "1")
    return opts


def exact_pair(pair: np.ndarray, tokens: np.ndarray, L: int, token: int) -> int:
    """Exact mode's two rows for one new `token` after L cached ones: `pair` = (the token before
    it, it), or (it, it) when nothing is cached (the copy is dropped after the call). Returns the
    row that is the new token's: the call starts at cache position L - row and keeps L + 1."""
    if L:
        pair[:] = tokens[L - 1], token
        return 1
    pair[:] = token
    return 0


def _fast_binding(session: ort.InferenceSession, io: ort.IOBinding):
    """(bind_input, bind_output, run) for CPU buffers given by pointer.

    The public IOBinding.bind_input builds an OrtDevice per call (~8 µs; a decoder step binds
    2 x layers + 4 tensors). With the pinned onnxruntime we call the pybind layer underneath
    (~0.9 µs), falling back to the public API where it is not there.
    """
    try:
        from onnxruntime.capi.onnxruntime_inference_collection import OrtDevice

        raw, sess = io._iobinding, session._sess
        device = OrtDevice.make("cpu", 0)._get_c_device()
        return (lambda n, t, shape, ptr: raw.bind_input(n, device, t, shape, ptr),
                lambda n, t, shape, ptr: raw.bind_output(n, device, t, shape, ptr),
                lambda: sess.run_with_iobinding(raw, None))
    except (AttributeError, ImportError):  # another onnxruntime: the public, slower calls
        return (lambda n, t, shape, ptr: io.bind_input(n, "cpu", 0, t, list(shape), ptr),
                lambda n, t, shape, ptr: io.bind_output(n, "cpu", 0, t, list(shape), ptr),
                lambda: session.run_with_iobinding(io))


# Ops that quantize activations: a token's logits then depend on whether it shares its pass
# (one-row and many-row kernels round differently; fp32 rows differ by ~1e-6, which does not move
# an argmax in practice, quantized rows by enough to flip tokens).
QUANTIZED_OPS = {"MatMulNBits", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat",
                 "QLinearMatMul", "QuantizeLinear", "DynamicQuantizeLinear", "GatherBlockQuantized"}


def exact_step_tokens(path: str | Path) -> int:
    """The exactness rule: 2 for a graph with quantized activations (a single new token is run
    together with the previous one, a first one with itself, so plain decoding uses the same
    numeric path as speculative verification and the two agree token for token), 1 otherwise.
    Read from the graph itself."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops = {n.op_type for n in model.graph.node}
    for fn in model.functions:
        ops |= {n.op_type for n in fn.node}
    return 2 if ops & QUANTIZED_OPS else 1


def _check_signature(sess: ort.InferenceSession, where: str) -> tuple[int, int, int, int, bool]:
    """Validate the decoder-with-past signature; return (n_layers, kv_heads, head_dim, vocab, has_pos)."""
    inputs = {i.name: i for i in sess.get_inputs()}
    outputs = {o.name: o for o in sess.get_outputs()}
    for name in ("input_ids", "attention_mask"):
        if name not in inputs:
            raise ValueError(f"{where}: missing input {name!r} (decoder-with-past layout expected)")
        if inputs[name].type != "tensor(int64)":
            raise ValueError(f"{where}: input {name!r} must be tensor(int64), got {inputs[name].type}")
    has_pos = "position_ids" in inputs
    past = {}
    for name, arg in inputs.items():
        if name in ("input_ids", "attention_mask", "position_ids"):
            continue
        m = _PAST.match(name)
        if not m:
            raise ValueError(f"{where}: unexpected input {name!r}")
        if arg.type != "tensor(float)":
            raise ValueError(f"{where}: input {name!r} must be tensor(float), got {arg.type}")
        past[(int(m[1]), m[2])] = arg
    n_layers = len(past) // 2
    if n_layers == 0:
        raise ValueError(f"{where}: no past_key_values.* inputs (is this a decoder without KV cache?)")
    for i in range(n_layers):
        for kind in ("key", "value"):
            if (i, kind) not in past:
                raise ValueError(f"{where}: missing input 'past_key_values.{i}.{kind}'")
            if f"present.{i}.{kind}" not in outputs:
                raise ValueError(f"{where}: missing output 'present.{i}.{kind}'")
    if "logits" not in outputs:
        raise ValueError(f"{where}: missing output 'logits'")
    for name in outputs:
        if name != "logits" and not _PRESENT.match(name):
            raise ValueError(f"{where}: unexpected output {name!r}")
    shape = past[(0, "key")].shape
    if len(shape) != 4 or not isinstance(shape[1], int) or not isinstance(shape[3], int):
        raise ValueError(f"{where}: past_key_values.0.key must be [batch, heads, past, head_dim] "
                         f"with static heads and head_dim, got {shape}")
    for (i, kind), arg in past.items():
        if list(arg.shape[1:2]) + list(arg.shape[3:]) != [shape[1], shape[3]]:
            raise ValueError(f"{where}: past_key_values.{i}.{kind} has shape {arg.shape}, expected {shape}")
    vocab = outputs["logits"].shape[-1]
    if not isinstance(vocab, int):
        raise ValueError(f"{where}: logits must have a static vocabulary dimension, got {outputs['logits'].shape}")
    return n_layers, shape[1], shape[3], vocab, has_pos


class DecoderSession:
    """A causal decoder with a preallocated KV cache of `max_context` positions (batch 1): a
    `decoder.Decoder` without draft heads, guessed prefills or `probs`."""

    draft_heads = 0  # the decoder-with-past layout has none (FusedDecoderSession's graphs may)
    row_probs = None  # nor a `probs` output: the callers take a softmax of the logits
    backend_info: dict | None = None  # set by factory.open_decoder

    def __init__(self, path: str | Path, max_context: int, threads: int = 1, name: str = "",
                 max_step_tokens: int = 128, min_step_tokens: int | None = None):
        self.name = name or Path(path).stem
        self.path = Path(path)
        try:
            self.session = ort.InferenceSession(str(path), session_options(threads),
                                                providers=["CPUExecutionProvider"])
        except Exception as e:  # ORT's own exception types: invalid graph, unknown (custom) op, ...
            raise ValueError(f"decoder {path}: ONNX Runtime cannot load it: {e}") from None
        self.n_layers, self.n_heads, self.head_dim, self.vocab, self._has_pos = _check_signature(
            self.session, f"decoder {self.path}")
        if max_context <= 0:
            raise ValueError(f"max_context must be positive, got {max_context}")
        self.max_context = max_context
        self.max_step_tokens = min(max_step_tokens, max_context)
        if min_step_tokens is None:
            min_step_tokens = exact_step_tokens(path)
        if min_step_tokens not in (1, 2):
            raise ValueError(f"min_step_tokens must be 1 or 2, got {min_step_tokens}")
        self.min_step_tokens = min_step_tokens  # 2 = exact mode (see exact_step_tokens)
        C, H, D, n_kv = max_context, self.n_heads, self.head_dim, 2 * self.n_layers
        self._kv = np.zeros((2, n_kv, H * C * D), np.float32)  # [buffer, tensor, H*C*D]
        self._logits = np.zeros(self.max_step_tokens * self.vocab, np.float32)
        self._ids = np.zeros(self.max_step_tokens, np.int64)
        self._pair = np.zeros(2, np.int64)
        self._ones = np.ones(C, np.int64)
        self._positions = np.arange(C, dtype=np.int64)
        self.tokens = np.zeros(C, np.int64)  # the ids whose keys/values are in the cache
        self.length = 0  # valid cache positions
        self._layout = 0  # the past length the current buffer is laid out for ([H, layout, D])
        self._cur = 0  # which ping-pong buffer holds the cache
        self._tensor_bytes = H * C * D * 4
        self._base = [int(self._kv[b].ctypes.data) for b in (0, 1)]
        self._kv_names = [(f"past_key_values.{i}.{k}", f"present.{i}.{k}")
                          for i in range(self.n_layers) for k in ("key", "value")]
        self._io = self.session.io_binding()
        self._bind_in, self._bind_out, self._run_bound = _fast_binding(self.session, self._io)
        self._ptr_ids = int(self._ids.ctypes.data)
        self._ptr_pair = int(self._pair.ctypes.data)
        self._ptr_ones = int(self._ones.ctypes.data)
        self._ptr_pos = int(self._positions.ctypes.data)
        self._ptr_logits = int(self._logits.ctypes.data)
        self.calls = 0
        self.guesser = None  # AnswerGuesser: unused here (guessed prefills need the fused layout)
        self.can_guess_prefill = False

    # -- cache bookkeeping ------------------------------------------------------------------
    def reset(self) -> None:
        self.length = 0
        self._layout = 0

    def rewind(self, n_keep: int) -> None:
        """Forget cached positions past `n_keep` (no copy now, no allocation ever)."""
        assert 0 <= n_keep <= self.length, (n_keep, self.length)
        self.length = n_keep

    def use_heads(self, on: bool, last: bool = False) -> None:
        """FusedDecoderSession's switch for its draft heads; an Optimum-layout decoder has none."""

    def _no_heads(self, *args):
        raise ValueError(f"{self.name}: the decoder-with-past layout has no draft heads (nor guessed prefills)")

    accepted = next_token = head_ids = property(_no_heads)  # read only where draft_heads > 0
    prefill_guessed = _no_heads  # can_guess_prefill is False

    def _compact(self) -> None:
        L, Lo, H, D = self.length, self._layout, self.n_heads, self.head_dim
        n_kv = 2 * self.n_layers
        src = self._kv[self._cur, :, : H * Lo * D].reshape(n_kv, H, Lo, D)[:, :, :L]
        dst = self._kv[1 - self._cur, :, : H * L * D].reshape(n_kv, H, L, D)
        np.copyto(dst, src)
        self._cur = 1 - self._cur
        self._layout = L

    # -- forward ----------------------------------------------------------------------------
    def forward(self, ids: np.ndarray) -> np.ndarray:
        """Append `ids` to the cache; return their logits [T, vocab] (a view, valid until the next call)."""
        T, L = len(ids), self.length
        if T:
            lo, hi = int(ids.min()), int(ids.max())
            if lo < 0 or hi >= self.vocab:
                raise ValueError(f"{self.name}: token ids must lie in [0, {self.vocab}), got [{lo}, {hi}]")
        if T == 1 and self.min_step_tokens == 2:  # exact mode: never one row alone
            row = exact_pair(self._pair, self.tokens, L, ids[0])
            self.rewind(L - row)
            logits = self._run(self._pair)[row:row + 1]
            self.rewind(L + 1)
            return logits
        return self._run(ids)

    def _run(self, ids: np.ndarray) -> np.ndarray:
        T, L = len(ids), self.length
        if T == 0:
            raise ValueError(f"{self.name}: forward needs at least one token")
        if T > self.max_step_tokens:
            raise ValueError(f"{self.name}: {T} tokens in one step exceed max_step_tokens={self.max_step_tokens}")
        if L + T > self.max_context:
            raise ValueError(f"{self.name}: context {L}+{T} exceeds max_context={self.max_context}")
        if L != self._layout:
            self._compact()
        H, D, V = self.n_heads, self.head_dim, self.vocab
        self._ids[:T] = ids
        bind_in, bind_out = self._bind_in, self._bind_out
        bind_in("input_ids", _I64, (1, T), self._ptr_ids)
        bind_in("attention_mask", _I64, (1, L + T), self._ptr_ones)
        if self._has_pos:
            bind_in("position_ids", _I64, (1, T), self._ptr_pos + 8 * L)
        src, dst = self._base[self._cur], self._base[1 - self._cur]
        past_shape, present_shape = (1, H, L, D), (1, H, L + T, D)
        for j, (past, present) in enumerate(self._kv_names):
            off = j * self._tensor_bytes
            bind_in(past, _F32, past_shape, src + off)
            bind_out(present, _F32, present_shape, dst + off)
        bind_out("logits", _F32, (1, T, V), self._ptr_logits)
        self._run_bound()
        self.calls += 1
        self._cur = 1 - self._cur
        self.tokens[L:L + T] = ids
        self.length = self._layout = L + T
        return self._logits[: T * V].reshape(T, V)  # [T, vocab]

    def prefill(self, prefix: np.ndarray) -> np.ndarray:
        """Make the cache hold `prefix`, reusing its longest cached leading part; return the last
        position's logits [vocab]. Long prefixes run in chunks of `max_step_tokens`."""
        n = len(prefix)
        if n == 0:
            raise ValueError(f"{self.name}: empty prefix")
        same = int(np.argmin(np.append(self.tokens[: min(self.length, n)] == prefix[: min(self.length, n)], False)))
        self.rewind(min(same, n - 1))  # the last prefix token is always recomputed for its logits
        logits = None
        while self.length < n:
            stop = min(n, self.length + self.max_step_tokens)
            logits = self.forward(prefix[self.length:stop])
        return logits[-1]

    def __repr__(self) -> str:
        return (f"DecoderSession({self.name}: {self.n_layers} layers, {self.n_heads}x{self.head_dim} kv, "
                f"vocab {self.vocab}, context {self.length}/{self.max_context})")
