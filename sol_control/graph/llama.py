"""Write a Llama decoder for ONNX Runtime (CPU) straight from numpy weights: the "fused" layout.

One graph per precision, built with `onnx` only (no torch, no onnxruntime-genai), from fused
ONNX Runtime ops: per layer one packed QKV projection (and one packed gate/up projection, split
after: `fuse_gate_up`, one kernel call instead of two), one `GroupQueryAttention` (rotary inside,
KV cache updated in place), `SkipSimplifiedLayerNormalization` (residual add + RMS norm in one
node), SiLU as `QuickGelu(alpha=1)`; linears are `MatMul` (fp32), `MatMulNBits` (int4) or
`MatMulIntegerToFloat` (int8).
For the grasp target (3 layers) that is 46 nodes (37 without the query pad below) against the
Optimum-style export's 125.

Graph I/O, layout "sol_control.fused/2" (batch 1; model metadata: layout, precision, max_context M,
query_pad P in {0, 1}: the cache rows kept for the pad, draft_heads K; C = M + P, static in the graph):

    input_ids              [1, T]        int64
    seqlens_k              [1]           int32   L + T - 1 + p (L = cached positions before the call)
    total_sequence_length  []            int32   L + T + p
    guesses                []            int64   G: the last G input ids are guesses to verify
    (optional) query_pad   [1]           int64   p in {0, 1}: the pad's rows this call (graphs
                                                 without this input: p = P always)
    (with K draft heads) heads_on  []    bool    run the heads this call (plain decoding: false;
                                                 `heads_switch=False` graphs: no input, always run)
    past_key_values.{i}.key|value  [1, kv_heads, C, head_dim] float32
      -> logits            [1, G+1, vocab] float32   the last G+1 rows only (a prefill needs 1)
         present.{i}.key|value  [1, kv_heads, C, head_dim]  (bind the SAME buffer as the past)
         (optional) argmax [1, G+1] int64   ArgMax of those logits
         (with K draft heads) accepted [1] int64   n: how many leading guesses equal the argmax
                                                   of the row before them (greedy acceptance)
                              head_ids [1, 1, K] int64   the heads' guesses at row n (the K
                                                   tokens after the one row n's logits predict;
                                                   zeros when heads_on is false)
                              probs [1, G+1] float32   each row's largest softmax probability
                                                   (the greedy token's confidence, by MLAS: a
                                                   numpy softmax of the rows cost 40-110 µs a
                                                   grasp pass, 0.5-1.5 ms a SmolLM2 one, AVX2)

`GroupQueryAttention` with the past and present bound to one buffer (past_present_share_buffer)
writes the new keys/values at rows [L, L+T+p) and attends causally over rows [0, L+T+p): a call
never copies the cache, and dropping the last n positions (a rejected draft) only means passing a
smaller L next time. Rotary positions are L.., taken from seqlens_k; the cos/sin tables hold C rows.

Query pad (P = 1, the default; p = 1 in a call): attention gets one extra all-zero query row after the T real ones;
its key/value land in cache row L+T (overwritten by the next call, never attended by a real row)
and its output is sliced off before o_proj. Why: with a single query row ONNX Runtime computes the
attention's probs x V product through MLAS's one-row SGEMM kernel (taken when M == 1 and alpha ==
1), whose summation order differs from the multi-row kernel; so a token's logits in a one-token
pass differ in the last bits from the same token's row in a multi-token verify pass, and
speculative decoding could part from plain greedy. The other ops here are row-independent (MatMul
on constant weights, the norms, MatMulNBits at accuracy level 4 with 4-bit blocks of <= 32 or
8-bit blocks of <= 64; larger blocks have their own one-row kernel too). With the pad, attention
never runs one row, and T=1 rows equal T=k+1 rows bit for bit, for 2 extra nodes a layer (~5 µs a
call on the grasp target) instead of re-running the previous token (~25 µs a step). Kernel choice
is ONNX Runtime's and the CPU's: `FusedDecoderSession.exact_rows()` checks it where it runs.
Only a one-token call needs the pad, so it is an input (`pad_input`, the default): a session passes
p = 1 when T = 1 and p = 0 otherwise, and verify passes, prefills and exact mode's pairs (every call
on a CPU whose int4 kernel breaks the rule) run no extra row (SmolLM2 int4 on an AVX2 host, 2
threads: exact mode's steps 8.90 instead of 9.10 ms a token; docs/BENCHMARKS.md).

Only the rows a caller reads leave the body: a prefill reads its last row, a verify pass of G
guesses G + 1 rows, so the lm_head runs on G + 1 rows, not T. Draft heads (`weights.heads`, K of
them): the graph checks the guesses itself (the first mismatch between a guess and the argmax of
the row before it) and runs the heads on that one row, where head j guesses the token j + 1 after
the row's own; so one call verifies the previous guesses and makes the next ones
(decoding.speculate_heads). The heads are fp32 in fp32 graphs and where int8 activations are not
allowed; otherwise (`heads_int8`) their weights are int8 per channel as the int8 linears (w2: one
integer GEMM per head; the argmax needs no row scale). Heads that read the model's own lm_head
cost K more lm_head rows a call (on SmolLM2 about as much as the rest of a one-token call);
`heads_vocab` n has them read its first n rows only, so they guess among tokens [0, n) (a BPE
vocabulary's most frequent: 88 % of SmolLM2's answer tokens lie below 8192). Chained heads
(`DraftHeads.w_prev`) also read the input embedding of the token before their guess, so they run
one after another inside the same call: head 1 reads the row's own argmax, head j the guess of head
j - 1 (K one-row products instead of one K-row product). The heads' nodes sit in an `If` on the
`heads_on` input (`heads_switch`, the default), so plain decoding on the same graph (the standard
row, the full-precision planner) does not pay for them: grasp fp32 0.24 instead of 0.29 ms a token,
for ~5 µs a call more when they run.

Precisions ("fp32", "int4", "int8"): the quantized ones put every linear into `MatMulNBits`
(block `block_size` along the input features, `accuracy_level` 4 = int8 activations):
- int4: 4-bit blocks with zero points (asymmetric RTN, `sol_control.graph.quant`), the lm_head in
  8 bits (`head_bits`), as the shipped int4 files; an `Int4Blocks` entry of `weights.int4` is
  written as given (an lm_head given so stays 4-bit), in one of two forms (`int4_zero_points`):
  "float": MatMulNBits with float zero points (exact; ONNX Runtime CPU does not prepack these,
  ~65x slower a call); "mins": w = q * d + m = (q - 8) * d + (m + 8 d) split into a symmetric
  MatMulNBits(x; q, d) (no zero points: the implicit 8, ONNX Runtime's fastest int4 path) plus
  blocksum(x) @ M.T, blocksum(x) [T, k/block] the sum of x over each block (one MatMul with a 0/1
  matrix) and M [n, k/block] = (8 - zero_point) * scale in fp32 (the same weights; a SmolLM2 call
  ~1.15x one with plain symmetric blocks).
- int8 (`int8_kernel`): "integer" (default) = weights int8 per output channel (symmetric), each
  activation row quantized on its own scale (|row max| / 64, uint8 in [0, 128] at zero point 64),
  one `MatMulIntegerToFloat` (MLAS's u8s8 GEMM) and the row scales. Why 7-bit rows: without VNNI
  (AVX2) MLAS multiplies u8 x s8 pairs with `vpmaddubsw`, which saturates a pair's sum at 32767;
  with u8 <= 128 and |w| <= 127 a pair is at most 32512, so the GEMM is exact on every x86 CPU
  (u8 up to 255 lost up to ~10 % of a sum there; s8 x s8 is exact but ~25x slower on AVX2). With
  VNNI its cost hardly grows with the rows of a call (a 9-row verify ~1.5x one row on [576 -> 1536],
  where MatMulNBits costs ~8x; on AVX2 a 9-row SmolLM2 verify is ~2.3x), and rows never depend on
  each other, so verify passes equal one-token
  passes bit for bit. `int8_activations` "static" quantizes each linear's input on one calibrated
  |max| instead (`train.calibrate`, stored in `LlamaWeights.activation_amax`): one QuantizeLinear
  an input instead of five nodes (grasp int8 + heads: 165 -> 105 nodes, 15-19 % less a decision
  on AVX-512), rows still independent. "nbits" = MatMulNBits 8-bit symmetric blocks, also taken when
  `accuracy_level` < 4 asks for fp32 activations. An 8-bit lm_head follows the same rule (int4
  graphs too).
A tied lm_head (= embed_tokens) is quantized like any other head; the embedding lookup then reads
the same quantized table through `GatherBlockQuantized`, so no fp32 [vocab, hidden] table is left
(except for a tied head given as float-zero-point `Int4Blocks`, which that op cannot read: the
embedding then stays a dequantized fp32 table).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import quant
from .weights import LlamaWeights

LAYOUT = "sol_control.fused/2"
PRECISIONS = ("fp32", "int4", "int8")
INT8_KERNELS = ("integer", "nbits")
INT8_ACTIVATIONS = ("rows", "dual", "static")
ROW_LEVELS = 64  # int8 activation rows: round(64 x / |row max|) + 64, uint8 in [0, 128] (docstring)
INPUT_IDS, SEQLENS_K, TOTAL_LEN, GUESSES, LOGITS, ARGMAX, HEAD_IDS, ACCEPTED, PROBS, QUERY_PAD, HEADS_ON = (
    "input_ids", "seqlens_k", "total_sequence_length", "guesses", "logits", "argmax", "head_ids", "accepted",
    "probs", "query_pad", "heads_on")
OPSET, MS_DOMAIN, IR_VERSION = 21, "com.microsoft", 10


def past_name(layer: int, kind: str) -> str:
    return f"past_key_values.{layer}.{kind}"


def present_name(layer: int, kind: str) -> str:
    return f"present.{layer}.{kind}"


@dataclass(frozen=True)
class BuildOptions:
    precision: str = "fp32"
    block_size: int = 32
    accuracy_level: int = 4  # MatMulNBits: 4 = int8 activations (fastest on CPU), 0 = fp32
    head_bits: int | None = 8  # lm_head in int4/int8 graphs: 4, 8, or None = fp32
    symmetric: bool | None = None  # body blocks without zero points (default: int8 yes, int4 no)
    max_context: int | None = None  # KV buffer length C (default: the config's max_context)
    argmax: bool = False  # add an `argmax` [1, T] output
    query_pad: bool = True  # attention may see one extra zero query row (see the module docstring)
    fuse_gate_up: bool = True  # the MLP's gate and up projections as one linear, split after
    pad_input: bool = True  # with query_pad: the pad's rows (0 or 1) are the `query_pad` input, else always 1
    int4_zero_points: str = "float"  # given Int4Blocks: "float" zero points or "mins" (module docstring)
    int8_kernel: str = "integer"  # int8 linears: "integer" (MatMulIntegerToFloat, rows) or "nbits" (module docstring)
    heads_int8: bool = True  # quantized graphs: the draft heads' weights in int8 too (integer kernel only)
    int8_activations: str = "rows"  # integer int8 linears: "rows", "dual" or "static" (module docstring)
    heads_vocab: int | None = None  # heads on the lm_head guess among tokens [0, n) only (module docstring)
    heads_switch: bool = True  # draft heads behind the `heads_on` input (an If), so plain decoding skips them

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"block_size must be a power of two >= 16, got {self.block_size}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"accuracy_level must be 0..4, got {self.accuracy_level}")
        if self.head_bits not in (None, 4, 8):
            raise ValueError(f"head_bits must be 4, 8 or None (fp32), got {self.head_bits}")
        if self.int4_zero_points not in ("float", "mins"):
            raise ValueError(f"int4_zero_points must be 'float' or 'mins', got {self.int4_zero_points!r}")
        if self.int8_activations not in INT8_ACTIVATIONS:
            raise ValueError(f"int8_activations must be one of {INT8_ACTIVATIONS}, got {self.int8_activations!r}")
        if self.int8_kernel not in INT8_KERNELS:
            raise ValueError(f"int8_kernel must be one of {INT8_KERNELS}, got {self.int8_kernel!r}")
        if self.heads_vocab is not None and self.heads_vocab < 1:
            raise ValueError(f"heads_vocab must be positive, got {self.heads_vocab}")
        if self.max_context is not None and self.max_context <= 0:
            raise ValueError(f"max_context must be positive, got {self.max_context}")

    @property
    def body_bits(self) -> int | None:
        """Bits of every linear but the lm_head: None (fp32 MatMul), 4 or 8."""
        return {"fp32": None, "int4": 4, "int8": 8}[self.precision]

    @property
    def integer_int8(self) -> bool:
        """8-bit linears as integer GEMMs: asked for, and int8 activations allowed (accuracy level 4)."""
        return self.int8_kernel == "integer" and self.accuracy_level == 4

    @property
    def body_symmetric(self) -> bool:
        return self.precision == "int8" if self.symmetric is None else self.symmetric


class _Writer:
    """Nodes and initializers of one graph, named after the Hugging Face tensors they come from."""

    def __init__(self):
        self.nodes, self.inits, self.const_names = [], [], set()
        self.block_sums: dict[tuple[str, int], str] = {}  # (input, block) -> its block sums, shared
        self.row_quant: dict[tuple[str, str], tuple[str, str]] = {}  # (input, mode) -> (uint8 rows, |max|), shared
        self.activation_amax: dict[str, float] = {}  # static int8 activations: input -> calibrated |max|

    def const(self, name: str, array: np.ndarray) -> str:
        """An initializer; a name written before is that one (the heads reuse the lm_head's)."""
        from onnx import numpy_helper

        if name not in self.const_names:
            self.const_names.add(name)
            self.inits.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], domain: str = "", **attrs) -> list[str]:
        from onnx import helper

        self.nodes.append(helper.make_node(op, inputs, outputs, name=f"{outputs[0]}/{op}", domain=domain, **attrs))
        return outputs


def _given_int4(weights: LlamaWeights, names: list[str], opts: BuildOptions) -> bool:
    """An int4 graph writes a linear whose Int4Blocks are given as given (4 bits, whatever head_bits)."""
    return opts.precision == "int4" and any(n in weights.int4 for n in names)


def _blocks(weights: LlamaWeights, name: str, bits: int, symmetric: bool, opts: BuildOptions) -> quant.Blocks:
    """MatMulNBits blocks of one HF linear: its Int4Blocks as given (int4 graphs), else quantized."""
    if opts.precision == "int4" and name in weights.int4:
        return quant.from_int4(weights.int4[name])
    return quant.quantize(weights.linear(name), bits, opts.block_size, symmetric)


def _linear(g: _Writer, x: str, out: str, names: list[str], weights: LlamaWeights, opts: BuildOptions,
            bits: int | None, symmetric: bool = False) -> str:
    """y = x @ concat(W_names).T as MatMul (bits None) or MatMulNBits; several names = one packed linear."""
    key = names[0] if len(names) == 1 else names[0].replace("q_proj", "qkv_proj").replace("gate_proj", "gate_up_proj")
    if _given_int4(weights, names, opts):
        bits = 4
    if bits is None:
        w = np.concatenate([weights.linear(n) for n in names], axis=0)  # [n_out, k_in]
        return g.node("MatMul", [x, g.const(f"{key}.T", w.T)], [out])[0]
    if bits == 8 and opts.integer_int8:
        w = np.concatenate([weights.linear(n) for n in names], axis=0)
        return _integer_linear(g, x, out, key, w, opts.int8_activations)
    b = quant.concat([_blocks(weights, n, bits, symmetric, opts) for n in names])
    mins = None
    if opts.int4_zero_points == "mins" and b.zero_points is not None and b.zero_points.dtype == np.float32:
        b, mins = quant.split_mins(b)
    inputs = [x, g.const(f"{key}.q{bits}", b.packed), g.const(f"{key}.scales", b.scales)]
    if b.zero_points is not None:
        inputs.append(g.const(f"{key}.zero_points", b.zero_points))
    y = g.node("MatMulNBits", inputs, [out if mins is None else f"{out}.nbits"], MS_DOMAIN, K=b.k, N=b.n,
               bits=bits, block_size=b.block_size, accuracy_level=opts.accuracy_level)[0]
    if mins is None:
        return y
    sums = _block_sums(g, x, b.k // b.block_size, b.block_size)  # [1, T, k/block]
    m = g.node("MatMul", [sums, g.const(f"{key}.mins.T", np.ascontiguousarray(mins.T))], [f"{out}.mins"])[0]
    return g.node("Add", [y, m], [out])[0]  # [1, T, n]


def _integer_linear(g: _Writer, x: str, out: str, key: str, w: np.ndarray, mode: str) -> str:
    """y = x @ w.T in int8: w [n_out, k_in] per output channel (symmetric, scale = |max| / 127), x
    quantized by `_row_quant` in `mode`; MatMulIntegerToFloat is MLAS's u8s8 GEMM. Its activation
    scale is |max| (rows: 1, and the rows' |max| multiplies the output after; static: the
    calibrated |max|, so nothing follows), the 1 / ROW_LEVELS is folded into the channel scales.
    "dual": the rows and their residuals in one GEMM of 2T rows, y = (y_rows + y_residuals /
    (2 ROW_LEVELS)) * |max|."""
    q, scales = quant.per_channel_int8(w)
    mode = _input_mode(g, x, mode)
    xq, amax = _row_quant(g, x, mode)
    a_scale = g.const(f"{x}.static_amax", np.array(g.activation_amax[x], np.float32)) if mode == "static" else "rowq.one"
    y = g.node("MatMulIntegerToFloat", [xq, g.const(f"{key}.s8.T", np.ascontiguousarray(q.T)), a_scale,
                                         g.const(f"{key}.channel_scales", scales / np.float32(ROW_LEVELS)), "rowq.zero_point"],
               [out if mode == "static" else f"{out}.unscaled"], MS_DOMAIN)[0]
    if mode == "static":
        return y
    if mode == "dual":
        hi, lo = g.node("Split", [y], [f"{out}.hi", f"{out}.lo"], axis=1, num_outputs=2)  # [1, T, n] each
        g.const("rowq.residual_weight", np.array(1 / (2 * ROW_LEVELS), np.float32))
        y = g.node("Add", [hi, g.node("Mul", [lo, "rowq.residual_weight"], [f"{out}.lo_scaled"])[0]], [f"{out}.sum"])[0]
    return g.node("Mul", [y, amax], [out])[0]  # [1, T, n]


def _input_mode(g: _Writer, x: str, mode: str) -> str:
    """"static" only for an input with a calibrated |max|; the others keep "rows" (calibration leaves
    out an input too wide for one scale)."""
    return "rows" if mode == "static" and x not in g.activation_amax else mode


def _row_quant(g: _Writer, x: str, mode: str) -> tuple[str, str]:
    """x [1, T, k] -> (uint8 [1, T, k], |max|): round(64 x / |max|) + 64, in [0, 128] (the module
    docstring says why 7 bits), |max| per `mode`:
    - "rows": each row's own |max| [1, T, 1], so a row's numbers never depend on the other rows of
      the call: a one-token pass equals that token's row in a verify pass bit for bit.
    - "static": one calibrated |max| for the input (`LlamaWeights.activation_amax`, made by
      `train.calibrate`), a constant; beyond it a value saturates. Rows stay independent, and the
      four nodes a "rows" input costs (Abs, ReduceMax, Max, Div) and the Mul after each GEMM go:
      one QuantizeLinear per input. For models whose activations keep one range (our policies).
    - "dual": uint8 [1, 2T, k], the rows, then what they left (x / |max| - the rows' values, in
      [-1/128, 1/128]) in steps 128 times finer: ~14 bits per activation for a GEMM of twice the
      rows (a language model's activations have too wide a range per row for 7 bits).
    Made once per input (q|k|v are one packed linear; gate and up share theirs)."""
    if (x, mode) in g.row_quant:
        return g.row_quant[(x, mode)]
    if mode != "static":
        g.const("rowq.one", np.array(1.0, np.float32))
    g.const("rowq.zero_point", np.array(ROW_LEVELS, np.uint8))
    if mode == "static":
        amax = np.float32(g.activation_amax[x])
        xq = g.node("QuantizeLinear", [x, g.const(f"{x}.static_step", np.array(amax / ROW_LEVELS, np.float32)),
                                       "rowq.zero_point"], [f"{x}.u8"])[0]
        g.row_quant[(x, mode)] = (xq, "")  # the |max| is a constant: _integer_linear's activation scale
        return g.row_quant[(x, mode)]
    g.const("rowq.tiny", np.array([1e-30], np.float32))
    g.const("rowq.step", np.array(1 / ROW_LEVELS, np.float32))
    g.const("rowq.last_axis", np.array([-1], np.int64))
    amax = g.node("ReduceMax", [g.node("Abs", [x], [f"{x}.abs"])[0], "rowq.last_axis"], [f"{x}.amax"], keepdims=1)[0]
    amax = g.node("Max", [amax, "rowq.tiny"], [f"{x}.amax_pos"])[0]  # an all-zero row stays zero
    unit = g.node("Div", [x, amax], [f"{x}.unit"])[0]  # [-1, 1]
    xq = g.node("QuantizeLinear", [unit, "rowq.step", "rowq.zero_point"], [f"{x}.u8"])[0]
    if mode == "dual":
        g.const("rowq.fine_step", np.array(1 / ROW_LEVELS / (2 * ROW_LEVELS), np.float32))
        back = g.node("DequantizeLinear", [xq, "rowq.step", "rowq.zero_point"], [f"{x}.u8_value"])[0]
        left = g.node("Sub", [unit, back], [f"{x}.residual"])[0]
        fine = g.node("QuantizeLinear", [left, "rowq.fine_step", "rowq.zero_point"], [f"{x}.residual_u8"])[0]
        xq = g.node("Concat", [xq, fine], [f"{x}.dual_u8"], axis=1)[0]  # [1, 2T, k]
    g.row_quant[(x, mode)] = (xq, amax)
    return g.row_quant[(x, mode)]


def _block_sums(g: _Writer, x: str, k_blocks: int, block: int) -> str:
    """x [1, T, k] -> [1, T, k/block]: the sum of x over each block, as one MatMul with a 0/1
    matrix (one node instead of Reshape + ReduceSum; made once per input)."""
    if (x, block) not in g.block_sums:
        ones = np.kron(np.eye(k_blocks, dtype=np.float32), np.ones((block, 1), np.float32))  # [k, k/block]
        g.block_sums[(x, block)] = g.node("MatMul", [x, g.const(f"block_sums.{k_blocks}x{block}", ones)],
                                          [f"{x}.block_sums"])[0]
    return g.block_sums[(x, block)]


def rotary_tables(head_dim: int, theta: float, positions: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin [positions, head_dim / 2] float32 of the angles transformers' Llama computes (float32).
    Nothing here may depend on numpy's SIMD paths, whose float32 pow/cos/sin differ in the last bit
    between AVX2 and AVX-512 (SVML) and made the graph's bytes depend on the CPU that built it: the
    powers theta^(2i/d) come from the C library's double pow, rounded once to float32; the cos and
    sin are taken in float64 and rounded once."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    powers = np.array([float(theta) ** float(e) for e in exponents], np.float64).astype(np.float32)
    inv_freq = (np.float32(1.0) / powers).astype(np.float32)
    freqs = (np.arange(positions, dtype=np.float32)[:, None] * inv_freq[None, :]).astype(np.float64)  # [C, D/2]
    return np.cos(freqs).astype(np.float32), np.sin(freqs).astype(np.float32)


def _embedding(g: _Writer, weights: LlamaWeights, opts: BuildOptions, ids: str = INPUT_IDS,
               out: str = "embeddings") -> str:
    """ids' rows of the input embedding: Gather of the fp32 table, or GatherBlockQuantized of the tied
    quantized head's table."""
    name = "model.embed_tokens.weight"
    head_bits = opts.head_bits if opts.precision != "fp32" else None
    if weights.config.tie_embeddings and head_bits is not None and not _given_int4(weights, [name], opts):
        b = _blocks(weights, name, head_bits, True if head_bits == 8 else opts.body_symmetric, opts)
        inputs = [g.const(f"{name}.q{head_bits}.table", b.packed.reshape(b.n, -1)), ids,
                  g.const(f"{name}.table_scales", b.scales)]
        if b.zero_points is not None:
            inputs.append(g.const(f"{name}.table_zero_points", b.zero_points))
        return g.node("GatherBlockQuantized", inputs, [out], MS_DOMAIN, bits=head_bits,
                      block_size=b.block_size, gather_axis=0, quantize_axis=1)[0]
    return g.node("Gather", [g.const(name, weights.linear(name)), ids], [out])[0]


def _pad_rows(g: _Writer, width: int, from_input: bool) -> None:
    """The query pad's shared parts: `pad_rows` [1, p, width] zeros (p = the `query_pad` input, or 1)
    and `pad.t` [1] = T, where each layer's attention output is cut back to the real rows."""
    for name, value in (("slice_0", 0), ("slice_1", 1), ("slice_2", 2)):
        g.const(name, np.array([value], np.int64))
    zeros = np.zeros((1, 1, width), np.float32)
    if from_input:
        g.node("Slice", [g.const("pad_row", zeros), "slice_0", QUERY_PAD, "slice_1"], ["pad_rows"])
    else:
        g.const("pad_rows", zeros)
    g.node("Slice", [g.node("Shape", [INPUT_IDS], ["pad.shape"])[0], "slice_1", "slice_2"], ["pad.t"])


def _layer(g: _Writer, weights: LlamaWeights, opts: BuildOptions, i: int, x: str, residual: str | None) -> tuple[str, str]:
    """One decoder layer; (MLP output, residual stream before it). `residual` None = first layer."""
    c, p, bits = weights.config, f"model.layers.{i}", opts.body_bits
    sym = opts.body_symmetric
    ln1 = g.const(f"{p}.input_layernorm.weight", weights.tensors[f"{p}.input_layernorm.weight"])
    if residual is None:  # x is the embedding: plain RMS norm, the residual stream is x itself
        h = g.node("SimplifiedLayerNormalization", [x, ln1], [f"{p}.ln1"], axis=-1, epsilon=c.rms_norm_eps)[0]
        resid = x
    else:  # residual + x, normed, in one node (output 3 is the sum: the new residual stream)
        h, _, _, resid = g.node("SkipSimplifiedLayerNormalization", [residual, x, ln1],
                                [f"{p}.ln1", "", "", f"{p}.resid1"], MS_DOMAIN, epsilon=c.rms_norm_eps)
    qkv = _linear(g, h, f"{p}.qkv", [f"{p}.self_attn.{n}_proj.weight" for n in "qkv"], weights, opts, bits, sym)
    pad = "padded_" if opts.query_pad else ""
    if opts.query_pad:  # [1, T, n] -> [1, T+p, n]: zero rows, written at cache row L+T, overwritten next call
        qkv = g.node("Concat", [qkv, "pad_rows"], [f"{p}.qkv_padded"], axis=1)[0]
    attn = g.node("GroupQueryAttention",
                  [qkv, "", "", past_name(i, "key"), past_name(i, "value"), SEQLENS_K, TOTAL_LEN, "cos_cache", "sin_cache"],
                  [f"{p}.{pad}attn", present_name(i, "key"), present_name(i, "value")], MS_DOMAIN,
                  num_heads=c.n_heads, kv_num_heads=c.n_kv_heads, scale=float(c.head_dim ** -0.5),
                  do_rotary=1, rotary_interleaved=0, local_window_size=-1)[0]
    if opts.query_pad:  # drop the pad row's output before o_proj, which then runs on T rows
        attn = g.node("Slice", [attn, "slice_0", "pad.t", "slice_1"], [f"{p}.attn"])[0]
    o = _linear(g, attn, f"{p}.o", [f"{p}.self_attn.o_proj.weight"], weights, opts, bits, sym)
    ln2 = g.const(f"{p}.post_attention_layernorm.weight", weights.tensors[f"{p}.post_attention_layernorm.weight"])
    h2, _, _, resid2 = g.node("SkipSimplifiedLayerNormalization", [resid, o, ln2],
                              [f"{p}.ln2", "", "", f"{p}.resid2"], MS_DOMAIN, epsilon=c.rms_norm_eps)
    if opts.fuse_gate_up:  # one linear of 2I outputs, split: one kernel call (and one mins term) instead of two
        both = _linear(g, h2, f"{p}.gate_up", [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"],
                       weights, opts, bits, sym)
        split = g.const("mlp.split", np.array([c.intermediate_size] * 2, np.int64))
        gate, up = g.node("Split", [both, split], [f"{p}.gate", f"{p}.up"], axis=-1)
    else:
        gate = _linear(g, h2, f"{p}.gate", [f"{p}.mlp.gate_proj.weight"], weights, opts, bits, sym)
        up = _linear(g, h2, f"{p}.up", [f"{p}.mlp.up_proj.weight"], weights, opts, bits, sym)
    act = g.node("QuickGelu", [gate], [f"{p}.silu"], MS_DOMAIN, alpha=1.0)[0]  # x * sigmoid(x)
    prod = g.node("Mul", [act, up], [f"{p}.gated"])[0]
    return _linear(g, prod, f"{p}.mlp", [f"{p}.mlp.down_proj.weight"], weights, opts, bits, sym), resid2


def _last_rows(g: _Writer, h: str) -> str:
    """h [1, T, H] -> its last G + 1 rows (G = the `guesses` input)."""
    g.const("rows.one", np.array(1, np.int64))
    g.const("rows.end", np.array([np.iinfo(np.int64).max], np.int64))
    g.const("rows.axis1", np.array([1], np.int64))
    n_rows = g.node("Add", [GUESSES, "rows.one"], ["rows.n"])[0]
    start = g.node("Neg", [n_rows], ["rows.start_scalar"])[0]
    g.const("rows.shape1", np.array([1], np.int64))
    start1 = g.node("Reshape", [start, "rows.shape1"], ["rows.start"])[0]
    return g.node("Slice", [h, start1, "rows.end", "rows.axis1"], ["rows.h"])[0]  # [1, G+1, H]


def _acceptance(g: _Writer, best: str) -> str:
    """accepted [1]: the index of the first guess that differs from the argmax of the row before it
    (G when all agree). best [1, G+1] = the rows' argmax; the guesses are input_ids' last G."""
    g.const("acc.zero", np.array([0], np.int64))
    g.const("acc.minus1", np.array([-1], np.int64))
    g.const("acc.axis1", np.array([1], np.int64))
    g.const("acc.two", np.array([2], np.int64))
    t = g.node("Slice", [g.node("Shape", [INPUT_IDS], ["acc.shape"])[0], "acc.axis1", "acc.two"], ["acc.t"])[0]
    start = g.node("Sub", [t, g.node("Reshape", [GUESSES, "rows.shape1"], ["acc.g1"])[0]], ["acc.start"])[0]
    guess = g.node("Slice", [INPUT_IDS, start, "rows.end", "acc.axis1"], ["acc.guess"])[0]  # [1, G]: T-G..
    before = g.node("Slice", [best, "acc.zero", "acc.minus1", "acc.axis1"], ["acc.before"])[0]  # [1, G]
    differ = g.node("Not", [g.node("Equal", [guess, before], ["acc.same"])[0]], ["acc.differ"])[0]
    g.const("acc.stop", np.ones((1, 1), bool))  # an always-differing sentinel after the last guess
    flags = g.node("Concat", [differ, "acc.stop"], ["acc.flags"], axis=1)[0]  # [1, G+1]
    as_int = g.node("Cast", [flags], ["acc.flags_i"], to=6)[0]  # int32: ArgMax takes no bool
    return g.node("ArgMax", [as_int], [ACCEPTED], axis=1, keepdims=0)[0]  # the first 1


def _draft_heads(g: _Writer, rows: str, best: str, n: str, weights: LlamaWeights, opts: BuildOptions,
                 out: str) -> None:
    """The heads' guesses `out` [1, 1, K] at row n (accepted [1]) of the selected rows' hidden
    states rows [1, G+1, H]."""
    heads, hidden = weights.heads, weights.config.hidden_size
    k = heads.k
    row = g.node("Gather", [rows, n], ["heads.h"], axis=1)[0]  # [1, 1, H]
    int8 = opts.precision != "fp32" and opts.heads_int8 and opts.integer_int8
    if int8:
        u = _integer_linear(g, row, "heads.u", "heads.w1", heads.w1.reshape(k * hidden, hidden), _heads_mode(opts))
    else:
        w1 = g.const("heads.w1", np.ascontiguousarray(heads.w1.transpose(2, 0, 1).reshape(hidden, k * hidden)))
        u = g.node("MatMul", [row, w1], ["heads.u"])[0]  # [1, 1, K*H]
    if heads.w_prev is not None:
        return _chained_heads(g, row, u, best, n, weights, opts, int8, out)
    g.const("heads.shape", np.array([k, hidden], np.int64))
    u2 = g.node("Reshape", [u, "heads.shape"], ["heads.u2"])[0]  # [K, H]
    act = g.node("QuickGelu", [u2], ["heads.silu"], MS_DOMAIN, alpha=1.0)[0]
    g.const("heads.row_shape", np.array([1, hidden], np.int64))
    base = g.node("Reshape", [row, "heads.row_shape"], ["heads.h2"])[0]  # [1, H]
    hj = g.node("Add", [base, act], ["heads.hj"])[0]  # [K, H]
    if heads.shared_head:  # the K rows as one call's rows [1, K, H]
        logits = _head_logits(g, _heads_batch(g, hj), "heads.logits", weights, opts, _heads_mode(opts) if int8 else None)
    elif int8:  # K rows, each through its own head's int8 w2 (argmax needs no row scale)
        hk = _heads_batch(g, hj)
        hq, _ = _row_quant(g, hk, _input_mode(g, hk, _heads_mode(opts)))  # [1, K, H] uint8
        g.const("rowq.one", np.array(1.0, np.float32))
        parts = g.node("Split", [hq], [f"heads.hq{j}" for j in range(k)], axis=1, num_outputs=k)
        outs = []
        for j, part in enumerate(parts):
            q, scales = quant.per_channel_int8(heads.w2[j])
            outs.append(g.node("MatMulIntegerToFloat", [part, g.const(f"heads.w2.{j}.s8.T", np.ascontiguousarray(q.T)),
                                                        "rowq.one", g.const(f"heads.w2.{j}.scales", scales),
                                                        "rowq.zero_point"], [f"heads.logits{j}"], MS_DOMAIN)[0])
        logits = g.node("Concat", outs, ["heads.logits"], axis=1)[0]  # [1, K, n_out]
    else:
        g.const("heads.axis1", np.array([1], np.int64))
        hk = g.node("Unsqueeze", [hj, "heads.axis1"], ["heads.hk"])[0]  # [K, 1, H]
        w2 = g.const("heads.w2", np.ascontiguousarray(heads.w2.transpose(0, 2, 1)))  # [K, H, n_out]
        logits = g.node("MatMul", [hk, w2], ["heads.logits"])[0]  # [K, 1, n_out]
    ids = g.node("ArgMax", [logits], ["heads.best"], axis=-1, keepdims=0)[0]  # [K, 1] or [1, K]
    g.const("heads.out_shape", np.array([1, 1, k], np.int64))
    ids3 = g.node("Reshape", [ids, "heads.out_shape"], ["heads.ids"])[0]
    g.const("heads.offset", np.array(heads.token_offset, np.int64))
    g.node("Add", [ids3, "heads.offset"], [out])


def _chained_heads(g: _Writer, row: str, u: str, best: str, n: str, weights: LlamaWeights, opts: BuildOptions,
                   int8: bool, out: str) -> None:
    """head_ids [1, 1, K] of heads that also read the embedding e of the token before their guess
    (DraftHeads.w_prev), one after another: head 1 reads the argmax of row n (the token the call
    emits there), head j > 1 head j - 1's guess. u [1, 1, K*H] = the heads' w1 @ h."""
    heads, k = weights.heads, weights.heads.k
    mode = _heads_mode(opts) if int8 else None
    prev = g.node("Gather", [best, n], ["heads.prev0"], axis=1)[0]  # [1, 1]
    parts = g.node("Split", [u], [f"heads.u{j}" for j in range(k)], axis=-1, num_outputs=k)
    ids = []
    for j, uj in enumerate(parts):
        e = _embedding(g, weights, opts, prev, f"heads.e{j}")  # [1, 1, H]
        if mode:
            v = _integer_linear(g, e, f"heads.v{j}", f"heads.w_prev.{j}", heads.w_prev[j], mode)
        else:
            w_prev = g.const(f"heads.w_prev.{j}.T", np.ascontiguousarray(heads.w_prev[j].T))
            v = g.node("MatMul", [e, w_prev], [f"heads.v{j}"])[0]
        act = g.node("QuickGelu", [g.node("Add", [uj, v], [f"heads.pre{j}"])[0]], [f"heads.silu{j}"], MS_DOMAIN,
                     alpha=1.0)[0]
        hj = g.node("Add", [row, act], [f"heads.hj{j}"])[0]  # [1, 1, H]
        logits = _head_logits(g, hj, f"heads.logits{j}", weights, opts, mode)
        prev = g.node("ArgMax", [logits], [f"heads.best{j}"], axis=-1, keepdims=0)[0]  # [1, 1]
        ids.append(prev)
    g.const("heads.out_shape", np.array([1, 1, k], np.int64))
    g.node("Reshape", [g.node("Concat", ids, ["heads.ids"], axis=1)[0], "heads.out_shape"], [out])


def _switched_heads(g: _Writer, write, k: int) -> None:
    """head_ids [1, 1, K] through an `If` on the `heads_on` input: the nodes `write(out)` adds run
    only when it is true, else head_ids is K zeros (module docstring). Initializers only the heads
    read move into the branch, so that ONNX Runtime sees them as the branch's constants."""
    from onnx import TensorProto, helper

    start = len(g.nodes)
    write("heads.on_ids")
    body, g.nodes[start:] = g.nodes[start:], []
    used_outside = {i for node in g.nodes for i in node.input}
    used_inside = {i for node in body for i in node.input}
    mine = used_inside - used_outside
    own = [t for t in g.inits if t.name in mine]
    g.inits[:] = [t for t in g.inits if t.name not in mine]
    g.const_names -= mine  # a later const() of one of these names writes it again, outside the branch
    ids = helper.make_tensor_value_info
    on = helper.make_graph(body, "heads_on", [], [ids("heads.on_ids", TensorProto.INT64, [1, 1, k])], initializer=own)
    zeros = helper.make_tensor("heads.zeros", TensorProto.INT64, [1, 1, k], [0] * k)
    off = helper.make_graph([helper.make_node("Constant", [], ["heads.off_ids"], value=zeros)], "heads_off", [],
                            [ids("heads.off_ids", TensorProto.INT64, [1, 1, k])])
    g.node("If", [HEADS_ON], [HEAD_IDS], then_branch=on, else_branch=off)


def _head_logits(g: _Writer, x: str, out: str, weights: LlamaWeights, opts: BuildOptions, int8_mode: str | None) -> str:
    """Rows x [1, R, H] of heads on the lm_head -> logits [1, R, n]: over its first n = heads_vocab
    rows (int8 per channel on single rows in quantized graphs, an argmax needs no more; fp32
    otherwise), or through the lm_head itself as the graph's own rows."""
    n = opts.heads_vocab
    if n is None or n >= weights.config.vocab_size:
        return _lm_head(g, x, out, weights, opts)
    w = weights.linear(weights.lm_head_name)[:n]  # [n, H]
    if int8_mode:
        return _integer_linear(g, x, out, "heads.vocab_slice", w, int8_mode)
    return g.node("MatMul", [x, g.const("heads.vocab_slice.T", np.ascontiguousarray(w.T))], [out])[0]


def _heads_batch(g: _Writer, hj: str) -> str:
    """The K heads' rows hj [K, H] as one call's rows [1, K, H]."""
    g.const("heads.axis0", np.array([0], np.int64))
    return g.node("Unsqueeze", [hj, "heads.axis0"], ["heads.hk"])[0]


def _heads_mode(opts: BuildOptions) -> str:
    """The heads' int8 activations: one row each ("rows"; an argmax needs no more), or "static"."""
    return "static" if opts.int8_activations == "static" else "rows"


def _lm_head(g: _Writer, x: str, out: str, weights: LlamaWeights, opts: BuildOptions) -> str:
    """x [1, R, hidden] -> logits [1, R, vocab] through the lm_head at the graph's precision."""
    head_bits = None if opts.precision == "fp32" else opts.head_bits
    head_sym = head_bits == 8 or opts.body_symmetric  # 8-bit heads: symmetric, as the shipped int4
    return _linear(g, x, out, [weights.lm_head_name], weights, opts, head_bits, head_sym)


def _io(weights: LlamaWeights, C: int, argmax: bool, pad_input: bool, heads_switch: bool) -> tuple[list, list]:
    from onnx import TensorProto, helper

    c = weights.config
    kv = [1, c.n_kv_heads, C, c.head_dim]
    inputs = [helper.make_tensor_value_info(INPUT_IDS, TensorProto.INT64, [1, "T"]),
              helper.make_tensor_value_info(SEQLENS_K, TensorProto.INT32, [1]),
              helper.make_tensor_value_info(TOTAL_LEN, TensorProto.INT32, []),
              helper.make_tensor_value_info(GUESSES, TensorProto.INT64, [])]
    if pad_input:
        inputs.append(helper.make_tensor_value_info(QUERY_PAD, TensorProto.INT64, [1]))
    if weights.heads is not None and heads_switch:
        inputs.append(helper.make_tensor_value_info(HEADS_ON, TensorProto.BOOL, []))
    outputs = [helper.make_tensor_value_info(LOGITS, TensorProto.FLOAT, [1, "R", c.vocab_size])]
    for i in range(c.n_layers):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(past_name(i, kind), TensorProto.FLOAT, kv))
            outputs.append(helper.make_tensor_value_info(present_name(i, kind), TensorProto.FLOAT, kv))
    if argmax:
        outputs.append(helper.make_tensor_value_info(ARGMAX, TensorProto.INT64, [1, "R"]))
    if weights.heads is not None:
        outputs.append(helper.make_tensor_value_info(ACCEPTED, TensorProto.INT64, [1]))
        outputs.append(helper.make_tensor_value_info(HEAD_IDS, TensorProto.INT64, [1, 1, weights.heads.k]))
        outputs.append(helper.make_tensor_value_info(PROBS, TensorProto.FLOAT, [1, "R"]))
    return inputs, outputs


def build_graph(weights: LlamaWeights, opts: BuildOptions):
    """The decoder as an onnx.ModelProto (see the module docstring for its I/O)."""
    from onnx import helper

    weights.validate()
    c = weights.config
    pad = int(opts.query_pad)
    C = (opts.max_context or c.max_context) + pad  # KV rows: the pad row needs one past the last position
    g = _Writer()
    g.activation_amax = weights.activation_amax
    cos, sin = rotary_tables(c.head_dim, c.rope_theta, C)
    g.const("cos_cache", cos)
    g.const("sin_cache", sin)
    if pad:
        _pad_rows(g, (c.n_heads + 2 * c.n_kv_heads) * c.head_dim, opts.pad_input)
    x, residual = _embedding(g, weights, opts), None
    for i in range(c.n_layers):
        x, residual = _layer(g, weights, opts, i, x, residual)
    norm = g.const("model.norm.weight", weights.tensors["model.norm.weight"])
    h = g.node("SkipSimplifiedLayerNormalization", [residual, x, norm], ["final_norm"], MS_DOMAIN,
               epsilon=c.rms_norm_eps)[0]
    rows = _last_rows(g, h)
    _lm_head(g, rows, LOGITS, weights, opts)
    if opts.argmax or weights.heads is not None:
        best = g.node("ArgMax", [LOGITS], [ARGMAX if opts.argmax else "rows.argmax"], axis=-1, keepdims=0)[0]
    if weights.heads is not None:
        n = _acceptance(g, best)
        if opts.heads_switch:
            _switched_heads(g, lambda out: _draft_heads(g, rows, best, n, weights, opts, out), weights.heads.k)
        else:
            _draft_heads(g, rows, best, n, weights, opts, HEAD_IDS)
        g.const("rows.axis_last", np.array([-1], np.int64))
        softmax = g.node("Softmax", [LOGITS], ["rows.softmax"], axis=-1)[0]
        g.node("ReduceMax", [softmax, "rows.axis_last"], [PROBS], keepdims=0)
    inputs, outputs = _io(weights, C, opts.argmax, bool(pad and opts.pad_input), opts.heads_switch)
    graph = helper.make_graph(g.nodes, "decoder", inputs, outputs, initializer=g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)],
                              producer_name="sol_control.graph.llama", ir_version=IR_VERSION)
    helper.set_model_props(model, {"layout": LAYOUT, "precision": opts.precision, "max_context": str(C - pad),
                                   "query_pad": str(pad),
                                   "draft_heads": str(weights.heads.k if weights.heads is not None else 0)})
    return model


def build_decoder(weights: LlamaWeights, path: str | Path, precision: str = "fp32", **options) -> Path:
    """Write the fused decoder graph of `weights` at `precision` to `path` (options: BuildOptions)."""
    import onnx

    model = build_graph(weights, BuildOptions(precision=precision, **options))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path
