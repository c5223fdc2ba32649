"""The native backend: a fused graph's whole pass in one C call (`sol_control/native/fused_pass.c`).

On our 2.9M-parameter policies an ONNX Runtime pass is mostly fixed cost: ~0.18 ms a call for the
72 nodes of the grasp int8 graph, ~14 µs a row; on SmolLM2-135M its int4 kernels run at ~11 GB/s
where one core reads ~30 GB/s (docs/BENCHMARKS.md, "The native backend"). The C pass computes the
same graph, read from the same ONNX file, its weights packed once in the layout every kernel variant
reads (generic C, AVX2, AVX-VNNI, AVX-512 VNNI, NEON dotprod: `sol_control.native.isa`; each session
runs one, `variant`, bit-equal to generic C's; tests/test_native_isa.py).

Two graph families, checked when a file loads (`NativeModel.from_onnx`; `NativeUnsupported` with
the reason otherwise, and ONNX Runtime runs it):
- int8 with "static" activations (one calibrated step an input: the shipped grasp and QC targets),
  fp32 embedding, plain draft heads (w1, then one int8 w2 each) or none;
- int4 of an imported LM ("fast" mode: 4-bit blocks of 32 without zero points at accuracy level 4
  plus the mins term, an 8-bit block-quantized embedding, an integer lm_head with "dual" or "rows"
  activations, chained heads or none), with or without a prefill graph:
  prefills then run on ONNX Runtime (the int8 graph) and the C pass takes their keys over
  (`sol_sync_keys`).

`NativeDecoderSession` is a FusedDecoderSession (same cache buffers, bookkeeping and interface,
the ORT session kept for its checks) whose calls run in C. It is exact by construction: a row's
numbers never depend on the other rows of its call (exact integer GEMMs, float reductions in one
fixed order), so a one-token pass equals the token's row in a verify pass and speculative decoding
equals plain greedy. Its logits need not equal ONNX Runtime's bit for bit (its own exp, its own
summation order; on the shipped graphs they differ by ~1e-6, docs/BENCHMARKS.md):
`agrees_with_onnxruntime` compares them when a session opens, and `open_decoder` keeps ORT when
they part (`MAX_RELATIVE_DIFF`).

Threads: with `threads` > 1 the wide linears (from 2^18 weights: SmolLM2's, grasp's lm_head and
gate/up) split their output columns over that many OpenMP threads, each output computed by one of
them as with one thread, so the numbers do not change (tested); SmolLM2 int4 at 2 threads: one
token 4.2 instead of 5.5 ms, four 5.5 instead of 8.2.

The library is built by `make native` and by setup.py's build step (`sol_control/native/build.py`);
without it, or with `SOL_CONTROL_BACKEND=onnxruntime` / `decoding.backend: onnxruntime`,
`open_decoder` uses ONNX Runtime.
"""
from __future__ import annotations

import ctypes
import functools
import os
from pathlib import Path

import numpy as np

from ..native import isa
from ..native.build import LIBRARY_NAME
from .fused import FusedDecoderSession

LIBRARY = Path(__file__).resolve().parent.parent / "native" / LIBRARY_NAME
BACKENDS = ("auto", "native", "onnxruntime")
GOMP_SPINCOUNT = 10_000
NATIVE_PRECISIONS = ("int8", "int4")  # the graphs "auto" offers the native pass (an fp32 file is not even read)
MAX_LAYERS, MAX_HEADS = 64, 16  # as in fused_pass.c
ZERO_POINT = 64  # as in pass.h: the int8 activations' zero point the C kernels subtract
# max |native - ORT| / max |ORT| over the probes' logits above this: the graph is not what we compute.
# Measured: 0 on the shipped grasp and QC graphs; SmolLM2-135M int4 ~0.03 (random-id probes, where
# 30 layers of int8 activation rounding add up); a misread weight gives ~1.
MAX_RELATIVE_DIFF = 0.1


class NativeUnsupported(ValueError):
    """This graph (or machine) is not one the native pass computes; ONNX Runtime runs it."""


LIN_STATIC, LIN_ROWS, LIN_DUAL, LIN_Q4 = range(4)  # a linear's kind, as in fused_pass.c
Q4_RECORD = 384  # bytes of one int4 record: 16 outputs x 32 inputs of nibbles, 16 scales, 16 mins


class _Linear(ctypes.Structure):
    _fields_ = [("w", ctypes.c_void_p), ("zp_sums", ctypes.c_void_p), ("scale", ctypes.c_void_p),
                ("step", ctypes.c_float), ("k", ctypes.c_int32), ("n", ctypes.c_int32), ("kind", ctypes.c_int32)]


class _Layer(ctypes.Structure):
    _fields_ = [("ln1", ctypes.c_void_p), ("ln2", ctypes.c_void_p), ("qkv", _Linear), ("o", _Linear),
                ("gate_up", _Linear), ("down", _Linear)]


class _Model(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in ("n_layers", "hidden", "n_heads", "kv_heads", "head_dim", "inter",
                                                     "vocab", "capacity", "n_draft", "head_offset", "chained",
                                                     "threads")] + [
        ("eps", ctypes.c_float), ("attn_scale", ctypes.c_float), ("embed", ctypes.c_void_p),
        ("embed_q8", ctypes.c_void_p), ("embed_scales", ctypes.c_void_p), ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p), ("final_norm", ctypes.c_void_p), ("layers", _Layer * MAX_LAYERS),
        ("lm_head", _Linear), ("heads_w1", _Linear), ("heads_w2", _Linear * MAX_HEADS),
        ("heads_prev", _Linear * MAX_HEADS), ("heads_vocab", _Linear), ("kernels", ctypes.c_void_p)]


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The built C pass (every kernel variant of this architecture, the best one this CPU runs
    chosen when it loads), or None: not built (`make native`)."""
    if not LIBRARY.is_file():
        return None
    # OpenMP's workers spin this long after a parallel part before they sleep (libgomp reads it once,
    # when the library loads): long enough for the gaps within a pass, short enough not to take a
    # core from the ONNX Runtime prefill that follows a decode (its default, 300,000, slowed the
    # SmolLM2 agent loop at 2 threads from 3.2 to 3.7 s)
    os.environ.setdefault("GOMP_SPINCOUNT", str(GOMP_SPINCOUNT))
    lib = ctypes.CDLL(str(LIBRARY))
    for fn in (lib.sol_kernels, lib.sol_kernels_best):
        fn.restype = ctypes.c_void_p
    lib.sol_kernels.argtypes = [ctypes.c_char_p]
    lib.sol_kernels_name.restype = lib.sol_variant_name.restype = ctypes.c_char_p
    lib.sol_kernels_name.argtypes = [ctypes.c_void_p]
    lib.sol_scratch_floats.restype = ctypes.c_long
    lib.sol_scratch_floats.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.sol_keys_t_floats.restype = ctypes.c_long
    lib.sol_keys_t_floats.argtypes = [ctypes.c_void_p]
    lib.sol_run.restype = ctypes.c_int
    lib.sol_sync_keys.argtypes = [ctypes.POINTER(_Model), ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return lib


def kernels(variant: str | None = None) -> int:
    """The C kernel table for `variant` (default: SOL_CONTROL_ISA, else the CPU probe's best), as a
    pointer for Model.kernels. ValueError for a variant this CPU lacks (naming the missing flags)
    or this library was not built with; NativeUnsupported without a library."""
    lib = library()
    if lib is None:
        raise NativeUnsupported(f"the native library is not built ({LIBRARY}: `make native`)")
    if variant is None:
        variant = isa.requested()
    if variant is None:
        return lib.sol_kernels_best()
    isa.check(variant, f"kernel variant {variant!r}")
    table = lib.sol_kernels(variant.encode())
    if not table:
        raise ValueError(f"kernel variant {variant!r} is not in {LIBRARY} or the CPU refuses it "
                         f"(built: {', '.join(built_variants())})")
    return table


def built_variants() -> list[str]:
    """The kernel variants in the library, best first ([] without a library)."""
    lib = library()
    names, i = [], 0
    while lib is not None and (name := lib.sol_variant_name(i)) is not None:
        names.append(name.decode())
        i += 1
    return names


def library_variant() -> str | None:
    """The variant a session opened now runs (SOL_CONTROL_ISA, else the probe's), or None without a
    library."""
    lib = library()
    return None if lib is None else lib.sol_kernels_name(kernels()).decode()


def backend_choice(backend: str | None = None) -> str:
    """The backend asked for: the argument unless it is None or "auto" (the config's default), else
    SOL_CONTROL_BACKEND (an operator's override, also for the node), else "auto"."""
    choice = backend if backend not in (None, "auto") else os.environ.get("SOL_CONTROL_BACKEND", "") or "auto"
    if choice not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {choice!r}")
    return choice


class NativeModel:
    """A fused int8 graph's weights in the C pass's layout (arrays kept alive beside the struct)."""

    def __init__(self, struct: _Model, arrays: list[np.ndarray]):
        self.struct, self._arrays = struct, arrays

    @classmethod
    def from_onnx(cls, path: str | Path) -> "NativeModel":
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(path))
        meta = {p.key: p.value for p in model.metadata_props}
        precision = meta.get("precision")
        if meta.get("layout") != "sol_control.fused/2" or precision not in ("int8", "int4"):
            raise NativeUnsupported(f"{path}: not a fused int8 or int4 graph (layout {meta.get('layout')!r}, "
                                    f"precision {precision!r})")
        nodes = list(model.graph.node)
        inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        branch = _heads_branch(nodes)
        for t in branch.initializer if branch is not None else []:
            inits[t.name] = numpy_helper.to_array(t)
        heads = int(meta.get("draft_heads", "0"))
        if precision == "int4":
            _check_int4_family(path, nodes, branch)
            return _Int4Builder(path, nodes, inits, heads).build()
        _check_family(path, nodes, branch, inits)
        return _Builder(path, nodes, inits, heads).build()


def _heads_branch(nodes):
    for node in nodes:
        if node.op_type == "If":
            return next(a.g for a in node.attribute if a.name == "then_branch")
    return None


_PLAIN_HEADS = ["Gather", "QuantizeLinear", "MatMulIntegerToFloat", "Reshape", "QuickGelu", "Reshape", "Add",
                "Unsqueeze", "QuantizeLinear", "Split"]


def _check_family(path, nodes, branch, inits) -> None:
    """Refuse what the C pass does not compute: int8 "rows"/"dual" activations, MatMulNBits,
    a quantized embedding, chained or lm_head-sharing heads."""
    ops = [n.op_type for n in nodes]
    for op in ("MatMulNBits", "GatherBlockQuantized", "Abs", "Div", "MatMul"):
        if op in ops:
            raise NativeUnsupported(f"{path}: has {op} nodes (the native pass: static int8 activations only)")
    for node in nodes + (list(branch.node) if branch is not None else []):
        if node.op_type == "MatMulIntegerToFloat" and node.input[2] not in inits:
            raise NativeUnsupported(f"{path}: {node.name} has no constant activation scale")
    if branch is not None:
        ops = [n.op_type for n in branch.node]
        k = ops.count("MatMulIntegerToFloat") - 1
        if ops[:len(_PLAIN_HEADS)] != _PLAIN_HEADS or ops[len(_PLAIN_HEADS):] != (
                ["MatMulIntegerToFloat"] * k + ["Concat", "ArgMax", "Reshape", "Add"]):
            raise NativeUnsupported(f"{path}: its draft heads are not plain w1 / w2 heads ({ops})")


_CHAINED_HEADS = {"Gather", "GatherBlockQuantized", "Abs", "ReduceMax", "Max", "Div", "QuantizeLinear",
                  "DequantizeLinear", "Sub", "Concat", "MatMulIntegerToFloat", "Mul", "Split", "Add", "QuickGelu",
                  "ArgMax", "Reshape"}


def _check_int4_family(path, nodes, branch) -> None:
    """An imported LM's "fast" int4 graph: 4-bit linears without zero points (blocks of 32, int8
    activations) with their mins term, an 8-bit block-quantized embedding, an integer lm_head, and
    chained heads over a slice of the vocabulary (or none)."""
    def attrs(node):
        return {a.name: a.i for a in node.attribute if a.type == 2}
    for node in nodes:
        a = attrs(node)
        if node.op_type == "MatMulNBits" and (len(node.input) > 3 or (a.get("bits"), a.get("block_size"),
                                                                        a.get("accuracy_level")) != (4, 32, 4)):
            raise NativeUnsupported(f"{path}: {node.name}: the native pass takes 4-bit blocks of 32 without zero "
                                    "points at accuracy level 4")
        if node.op_type == "MatMul" and not (node.input[1].startswith("block_sums.") or node.input[1].endswith(".mins.T")):
            raise NativeUnsupported(f"{path}: {node.name}: an fp32 MatMul outside the mins term")
        if node.op_type == "GatherBlockQuantized" and (a.get("bits"), a.get("block_size")) != (8, 32):
            raise NativeUnsupported(f"{path}: {node.name}: the embedding must be 8-bit blocks of 32")
    if not any(n.op_type == "MatMulIntegerToFloat" and n.output[0].startswith("logits") for n in nodes):
        raise NativeUnsupported(f"{path}: the lm_head is not an integer linear")
    if branch is not None and ({n.op_type for n in branch.node} - _CHAINED_HEADS
                               or "heads.w_prev.0.s8.T" not in {t.name for t in branch.initializer}):
        raise NativeUnsupported(f"{path}: its draft heads are not chained heads on integer linears")


class _Builder:
    """The graph's initializers, by the names `sol_control.graph.llama` gives them, into a _Model."""

    def __init__(self, path, nodes, inits, n_draft):
        self.path, self.inits, self.n_draft, self.arrays = path, inits, n_draft, []
        zero_point = int(self.get("rowq.zero_point").reshape(-1)[0])  # the graph's, read by every integer linear
        if zero_point != ZERO_POINT:
            raise NativeUnsupported(f"{path}: int8 activations at zero point {zero_point}; the C pass "
                                    f"subtracts {ZERO_POINT}")
        self.gqa = next(n for n in nodes if n.op_type == "GroupQueryAttention")
        self.eps = next(a.f for n in nodes if n.op_type == "SimplifiedLayerNormalization" for a in n.attribute
                        if a.name == "epsilon")

    def keep(self, array: np.ndarray, dtype) -> int:
        a = np.ascontiguousarray(array, dtype=dtype)
        self.arrays.append(a)
        return a.ctypes.data

    def get(self, name: str) -> np.ndarray:
        if name not in self.inits:
            raise NativeUnsupported(f"{self.path}: no initializer {name!r}")
        return self.inits[name]

    def linear(self, key: str, x: str | None, amax: str | None = None, scales: str | None = None,
               kind: int = LIN_STATIC) -> _Linear:
        """An int8 linear `key` (its s8.T [k, n]) reading input `x` (its static step; None for the
        "rows" and "dual" kinds, which quantize each row on its own |max|)."""
        w = self.get(f"{key}.s8.T")
        k, n = w.shape
        if k % 16:
            raise NativeUnsupported(f"{self.path}: {key} has {k} inputs; the native pass needs a multiple of 16")
        padded = np.zeros((k, -(-n // 16) * 16), np.int8)
        padded[:, :n] = w
        packed = padded.reshape(k // 4, 4, -1, 16).transpose(2, 0, 3, 1)  # [ceil(n/16)][k/4][16][4]
        static = kind == LIN_STATIC
        a_scale = (self.get(amax) if amax else self.get(f"{x}.static_amax")) if static else np.float32(1)
        scale = (a_scale.astype(np.float32) * self.get(scales or f"{key}.channel_scales")).astype(np.float32)
        zp = (ZERO_POINT * w.astype(np.int32).sum(axis=0)).astype(np.int32)  # the activations' zero point
        step = float(self.get(f"{x}.static_step").reshape(())) if static else 0.0
        return _Linear(self.keep(packed, np.int8), self.keep(zp, np.int32), self.keep(scale.reshape(n), np.float32),
                       step, k, n, kind)

    HIDDEN_MULTIPLE = 16  # the C pass sums 16 lanes at a time
    CHAINED = False  # plain draft heads

    def build(self) -> NativeModel:
        m = self.model()
        for i in range(m.n_layers):
            m.layers[i] = self.layer(f"model.layers.{i}")
        self.head_and_heads(m)
        return NativeModel(m, self.arrays)

    def head_and_heads(self, m: _Model) -> None:
        """The lm_head and plain draft heads (w1, then one int8 w2 each), static activations."""
        m.lm_head = self.linear("lm_head.weight", "rows.h")
        if self.n_draft:
            m.heads_w1 = self.linear("heads.w1", "heads.h")
            m.head_offset = int(self.get("heads.offset").reshape(()))
            for j in range(self.n_draft):
                m.heads_w2[j] = self.linear(f"heads.w2.{j}", "heads.hk", amax="rowq.one", scales=f"heads.w2.{j}.scales")

    def embedding(self) -> tuple[int, int, dict]:
        """(vocab, hidden, the _Model fields of the embedding table): fp32 here."""
        embed = self.get("model.embed_tokens.weight")
        return embed.shape[0], embed.shape[1], {"embed": self.keep(embed, np.float32)}

    def inter(self) -> int:
        return self.get("model.layers.0.mlp.gate_up_proj.weight.s8.T").shape[1] // 2

    def model(self) -> _Model:
        """The sizes and the float tables (embedding, rotary, final norm), checked against the C limits."""
        attrs = {a.name: a for a in self.gqa.attribute}
        cos = self.get("cos_cache")
        vocab, hidden, embedding = self.embedding()
        n_layers = sum(1 for name in self.inits if name.endswith(".input_layernorm.weight"))
        head_dim = 2 * cos.shape[1]
        if hidden % self.HIDDEN_MULTIPLE or head_dim % 16:
            raise NativeUnsupported(f"{self.path}: hidden size {hidden} and head dim {head_dim} must be "
                                    f"multiples of {self.HIDDEN_MULTIPLE} and 16 (the C pass's sums and blocks)")
        if n_layers > MAX_LAYERS or self.n_draft > MAX_HEADS:
            raise NativeUnsupported(f"{self.path}: {n_layers} layers / {self.n_draft} heads exceed "
                                    f"{MAX_LAYERS} / {MAX_HEADS}")
        return _Model(n_layers=n_layers, hidden=hidden, n_heads=attrs["num_heads"].i, kv_heads=attrs["kv_num_heads"].i,
                      head_dim=head_dim, inter=self.inter(), vocab=vocab, capacity=cos.shape[0],
                      n_draft=self.n_draft, chained=int(self.CHAINED and self.n_draft > 0), eps=self.eps,
                      attn_scale=attrs["scale"].f, cos=self.keep(cos, np.float32),
                      sin=self.keep(self.get("sin_cache"), np.float32),
                      final_norm=self.keep(self.get("model.norm.weight"), np.float32), **embedding)

    def body(self, key: str, x: str) -> _Linear:
        """A linear of a layer, `x` its input's name (static int8 here)."""
        return self.linear(key, x)

    def layer(self, p: str) -> _Layer:
        return _Layer(self.keep(self.get(f"{p}.input_layernorm.weight"), np.float32),
                      self.keep(self.get(f"{p}.post_attention_layernorm.weight"), np.float32),
                      self.body(f"{p}.self_attn.qkv_proj.weight", f"{p}.ln1"),
                      self.body(f"{p}.self_attn.o_proj.weight", f"{p}.attn"),
                      self.body(f"{p}.mlp.gate_up_proj.weight", f"{p}.ln2"),
                      self.body(f"{p}.mlp.down_proj.weight", f"{p}.gated"))


class _Int4Builder(_Builder):
    """An imported LM's int4 graph (`_check_int4_family`): the 4-bit linears repacked as the C pass's
    records, the 8-bit embedding table, the integer lm_head and the chained heads."""

    def __init__(self, path, nodes, inits, n_draft):
        super().__init__(path, nodes, inits, n_draft)
        head = next(n for n in nodes if n.op_type == "MatMulIntegerToFloat" and n.output[0].startswith("logits"))
        self.head_key = head.input[1][:-len(".s8.T")]
        self.head_kind = LIN_DUAL if head.input[0].endswith(".dual_u8") else LIN_ROWS

    HIDDEN_MULTIPLE = 32  # the embedding's 8-bit blocks and the activations' int8 blocks
    CHAINED = True

    def embedding(self) -> tuple[int, int, dict]:
        """The tied head's 8-bit table (GatherBlockQuantized, blocks of 32)."""
        table = self.get("model.embed_tokens.weight.q8.table")
        scales = self.get("model.embed_tokens.weight.table_scales")
        return table.shape[0], table.shape[1], {"embed_q8": self.keep(table, np.uint8),
                                                "embed_scales": self.keep(scales, np.float32)}

    def inter(self) -> int:
        return self.get("model.layers.0.mlp.gate_up_proj.weight.q4").shape[0] // 2

    def head_and_heads(self, m: _Model) -> None:
        """The integer lm_head (dual or rows activations) and the chained heads, rows activations."""
        m.lm_head = self.linear(self.head_key, None, kind=self.head_kind)
        if self.n_draft:
            m.heads_w1 = self.linear("heads.w1", None, kind=LIN_ROWS)
            for j in range(self.n_draft):
                m.heads_prev[j] = self.linear(f"heads.w_prev.{j}", None, kind=LIN_ROWS)
            # over the first n tokens (heads_vocab), or through the lm_head itself
            slice_ = "heads.vocab_slice.s8.T" in self.inits
            m.heads_vocab = self.linear("heads.vocab_slice", None, kind=LIN_ROWS) if slice_ else m.lm_head

    def body(self, key: str, x: str) -> _Linear:
        return self.q4(key)

    def q4(self, key: str) -> _Linear:
        """A 4-bit linear (MatMulNBits [n, k/32, 16] nibbles, low first; w = (q - 8) * scale, plus its
        mins term) as records [n/16][k/32] of 384 bytes: byte 64j + 4l + i holds output l's inputs
        8j + i (low nibble) and 8j + 4 + i (high), then the 16 outputs' scales and mins (fp32)."""
        q, scales = self.get(f"{key}.q4"), self.get(f"{key}.scales")
        n, blocks = scales.shape
        if n % 16:
            raise NativeUnsupported(f"{self.path}: {key} has {n} outputs; the native pass needs a multiple of 16")
        mins = self.inits.get(f"{key}.mins.T", np.zeros((blocks, n), np.float32)).T  # [n, blocks]
        nib = np.empty((n, blocks, 32), np.uint8)
        nib[..., 0::2], nib[..., 1::2] = q & 15, q >> 4
        nib = nib.reshape(n // 16, 16, blocks, 4, 2, 4)  # [g, l, b, j, half, i]: input 8j + 4 half + i
        weights = (nib[..., 0, :] | (nib[..., 1, :] << 4)).transpose(0, 2, 3, 1, 4).reshape(n // 16, blocks, 256)
        meta = [np.ascontiguousarray(a.reshape(n // 16, 16, blocks).transpose(0, 2, 1), np.float32).view(np.uint8)
                for a in (scales, mins)]
        records = np.concatenate([weights, *meta], axis=2)  # [g, b, 384]
        assert records.shape[2] == Q4_RECORD
        return _Linear(self.keep(records, np.uint8), None, None, 0.0, blocks * 32, n, LIN_Q4)


class NativeDecoderSession(FusedDecoderSession):
    """A FusedDecoderSession whose calls run the C pass (module docstring). Raises NativeUnsupported
    when the graph or the build does not allow it."""

    def __init__(self, path: str | Path, max_context: int | None = None, threads: int = 1,
                 variant: str | None = None, **kwargs):
        """`variant`: the kernels to run ("avx2", "generic", ...; default SOL_CONTROL_ISA, else the
        CPU probe's best)."""
        lib = library()
        table = kernels(variant)  # NativeUnsupported without the library, ValueError for a CPU without it
        self.native = NativeModel.from_onnx(path)
        self.native.struct.kernels = table
        self.variant = lib.sol_kernels_name(table).decode()
        self._through_ort = False  # agrees_with_onnxruntime: the same calls through the ORT session
        kwargs["min_step_tokens"] = kwargs.get("min_step_tokens") or 1  # rows never depend on each other
        super().__init__(path, max_context, threads, **kwargs)
        m = self.native.struct
        m.threads = threads  # the wide linears' (OpenMP), as ONNX Runtime's intra-op threads
        if m.capacity != self._capacity or m.vocab != self.vocab:
            raise NativeUnsupported(f"{path}: graph tables ({m.capacity} rows, vocab {m.vocab}) do not match its "
                                    f"I/O ({self._capacity}, {self.vocab})")
        self._scratch = np.zeros(lib.sol_scratch_floats(ctypes.byref(m), self.max_step_tokens), np.float32)
        self._keys_t = np.zeros(lib.sol_keys_t_floats(ctypes.byref(m)), np.float32)  # the C pass's own key layout
        self._c_run, self._sync_keys = lib.sol_run, lib.sol_sync_keys
        ptr = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731
        self._c_args = (ctypes.byref(m), ptr(self._ids))  # sol_run's arguments before T, L, rows, heads_on
        self._c_buffers = tuple(ptr(a) for a in (self._kv, self._keys_t, self._logits, self._probs, self._accepted,
                                                 self._heads, self._scratch))  # and after them
        self._c_keys = self._c_buffers[:2]  # the cache and the tiled keys: sol_sync_keys' arguments

    def _call(self, T: int, L: int, rows: int, b) -> None:
        if self._through_ort or b is not self._main:  # ONNX Runtime: a prefill graph, or the check
            super()._call(T, L, rows, b)
            self._sync_keys(self.native.struct, *self._c_keys, L, L + T)
            return
        if self._c_run(*self._c_args, T, L, rows, self._heads_mode, *self._c_buffers):
            raise ValueError(f"{self.name}: native pass refused T={T} after L={L} ({rows} rows)")

    @property
    def next_token(self) -> int:
        """The argmax of row `accepted`, as the C pass found it (sol_run's accepted[1])."""
        if self._through_ort:
            return super().next_token
        assert self.draft_heads, f"{self.name} has no draft heads"
        return int(self._accepted[1])

    def agrees_with_onnxruntime(self, probes: int = 3) -> float:
        """The largest |logit| difference between this pass and ONNX Runtime's on the same graph,
        over a few random prefixes and 3-row verify passes, relative to ORT's largest |logit|
        (resets the cache)."""
        rng, worst = np.random.default_rng(1), 0.0
        try:
            for _ in range(probes):
                ids = rng.integers(0, self.vocab, min(8, self.max_context))
                got = []
                for self._through_ort in (False, True):
                    self.reset()
                    self._run(ids[:-3], 1)
                    got.append(self._run(ids[-3:], 3).copy())
                worst = max(worst, float(np.max(np.abs(got[0] - got[1])) / max(np.max(np.abs(got[1])), 1e-30)))
            return worst
        finally:
            self._through_ort = False
            self.reset()

    def __repr__(self) -> str:
        return f"Native[{self.variant}]" + super().__repr__()
