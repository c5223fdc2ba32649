"""Static int8 activations: the largest |value| each int8 linear's input takes on real decisions.

`graph.llama` with `int8_activations="static"` quantizes a linear's input on one constant |max|
instead of each row's own (one QuantizeLinear instead of five nodes an input). `static_int8` makes
those constants: it runs the fp32 graph of the same weights on calibration sequences (prefix + the
fp32 target's own greedy answer, every prefix of the answer, so that the draft heads see each
position they guess from) and keeps each input's largest |value| per channel (`channel_amax`);
it evens out the one input whose channels differ most, each MLP's SiLU(gate) * up (`smooth_mlp`),
and keeps one |max| per input. Beyond it an input saturates at run time, deterministically, so
exactness (rows independent) is unaffected; quality is what `sol-control eval` checks. The inputs
are found the same way in both graphs: in the fp32 graph they are the first inputs of the MatMuls
on constant weights, in the int8 graph the inputs the builder quantizes, by the same names.

    build_decoder(static_int8(weights, task_sequences(bundle, 256)), path, "int8", int8_activations="static")

It runs when a bundle is made (`sol-control train`, tools/make_models.py), never in the node: it
builds graphs (graph/), decodes (decoding/) and reads task scenes (eval), so it sits above all three.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from sol_control.graph.llama import GUESSES, INPUT_IDS, SEQLENS_K, TOTAL_LEN, BuildOptions, build_graph, past_name
from sol_control.graph.weights import LlamaWeights

N_CALIBRATION = 256  # training scenes (policy bundles)
AMAX_STEPS = 8  # calibrated |max| on a grid of 2^(1/8) (~9 %), rounded up (`on_grid`)
SMOOTH_ALPHA = 0.8  # grasp, 300 test decisions equal to fp32's: 0.5 -> 272, 0.8 -> 287, 1.0 -> 283 (rows: 291)


def linear_inputs(model) -> list[str]:
    """The tensors that feed a MatMul on a constant weight (an initializer), in graph order."""
    consts = {t.name for t in model.graph.initializer}
    names = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in consts and node.input[0] not in names:
            names.append(node.input[0])
    return names


def _probe_session(weights: LlamaWeights, max_context: int):
    """The fp32 graph with every linear input as an extra output: (session, the linear inputs'
    names, the KV buffer's length C)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    from sol_control.decoding import session_options

    # pad: always 1; the heads in the main graph, where their inputs can be outputs too
    model = build_graph(weights, BuildOptions("fp32", max_context=max_context, pad_input=False, heads_switch=False))
    names = linear_inputs(model)
    model.graph.output.extend(helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names)
    sess = ort.InferenceSession(model.SerializeToString(), session_options(1), providers=["CPUExecutionProvider"])
    capacity = next(i.shape[2] for i in sess.get_inputs() if i.name == past_name(0, "key"))
    return sess, names, capacity


def channel_amax(weights: LlamaWeights, sequences: list[tuple[np.ndarray, int]]) -> dict[str, np.ndarray]:
    """Input tensor name -> the largest |value| of each of its channels over `sequences`: (ids,
    prompt length) pairs, each run from an empty cache once per length from the prompt's to the
    whole (the heads' input is the last row's). ValueError on an empty list or a sequence longer
    than the model's context."""
    if not sequences:
        raise ValueError("channel_amax: no calibration sequences")
    c = weights.config
    sess, names, capacity = _probe_session(weights, c.max_context)
    pad = capacity - c.max_context
    kv = np.zeros((1, c.n_kv_heads, capacity, c.head_dim), np.float32)
    past = {past_name(i, kind): kv for i in range(c.n_layers) for kind in ("key", "value")}
    amax: dict[str, np.ndarray] = {}
    for ids, prompt in sequences:
        if not 0 < prompt <= len(ids) <= c.max_context:
            raise ValueError(f"channel_amax: prompt {prompt} of a {len(ids)}-token sequence (context {c.max_context})")
        for t in range(prompt, len(ids) + 1):
            feed = {INPUT_IDS: np.asarray(ids[:t], np.int64)[None], SEQLENS_K: np.array([t - 1 + pad], np.int32),
                    TOTAL_LEN: np.array(t + pad, np.int32), GUESSES: np.array(0, np.int64), **past}
            for name, value in zip(names, sess.run(names, feed)):
                seen = np.abs(value).reshape(-1, value.shape[-1]).max(axis=0)
                amax[name] = np.maximum(amax[name], seen) if name in amax else seen
    return amax


def on_grid(values: np.ndarray, steps_per_octave: int) -> np.ndarray:
    """Each value rounded up to the next power of 2^(1 / steps_per_octave): calibrated constants
    that come out the same on CPUs whose fp32 kernels differ in the last bits (AVX2, AVX-512), so
    the graph's bytes do not depend on the CPU that built it."""
    v = np.maximum(np.asarray(values, np.float64), 1e-6)
    return np.exp2(np.ceil(np.log2(v) * steps_per_octave) / steps_per_octave).astype(np.float32)


def smooth_mlp(weights: LlamaWeights, amax: dict[str, np.ndarray], alpha: float = SMOOTH_ALPHA) -> LlamaWeights:
    """The same model with each MLP's down_proj input evened out (SmoothQuant): channel j of
    SiLU(gate) * up divided by s_j (up_proj's row j), down_proj's column j multiplied by it, s_j ~
    amax_j^alpha / max|down[:, j]|^(1 - alpha) as a power of two, so the fp32 model is unchanged
    bit for bit. The product's |max| over channels (~100 on the grasp target, its rows' ~10)
    shrinks ~30x, so one static scale fits it. A copy; `amax` is `channel_amax`'s, whose entries
    for those inputs are divided by s. The activation_amax of the copy: one |max| an input."""
    tensors = dict(weights.tensors)
    smoothed = dict(amax)
    for i in range(weights.config.n_layers):
        p = f"model.layers.{i}"
        up, down, x = f"{p}.mlp.up_proj.weight", f"{p}.mlp.down_proj.weight", f"{p}.gated"
        if x not in amax or up not in tensors or down not in tensors:
            continue  # a linear given as int4 blocks only: left as it is
        w_max = np.abs(tensors[down]).max(axis=0)
        raw = np.maximum(amax[x], 1e-6) ** alpha / np.maximum(w_max, 1e-6) ** (1 - alpha)
        s = np.exp2(np.round(np.log2(raw))).astype(np.float32)
        tensors[up] = tensors[up] / s[:, None]
        tensors[down] = tensors[down] * s[None, :]
        smoothed[x] = amax[x] / s
    amax_one = {n: float(on_grid(a.max(), AMAX_STEPS)) for n, a in smoothed.items()}
    return replace(weights, tensors=tensors, activation_amax=amax_one)


def static_int8(weights: LlamaWeights, sequences: list[tuple[np.ndarray, int]]) -> LlamaWeights:
    """`weights` made ready for `build_decoder(..., "int8", int8_activations="static")`: MLPs
    smoothed and every int8 linear's input calibrated on `sequences`."""
    return smooth_mlp(weights, channel_amax(weights, sequences))


def bundle_static_int8(bundle, n_scenes: int = N_CALIBRATION) -> tuple[LlamaWeights, dict]:
    """A policy bundle's target (its fp32 file, the heads read back from its fused fp32 graph)
    calibrated on its own answers to the first `n_scenes` training scenes; (weights, a record for
    the manifest). What tools/make_models.py writes as the int8 graph, and the test rebuilds."""
    from sol_control.graph.from_onnx import read_decoder, read_heads

    m = bundle.manifest
    weights = read_decoder(bundle.verify(m.target.files["fp32"]), m.max_context)
    weights.heads = read_heads(bundle.verify(m.target.fused["fp32"]))
    sequences = task_sequences(bundle, n_scenes)
    record = {"activations": "static", "calibration": f"{len(sequences)} training scenes", "smooth_alpha": SMOOTH_ALPHA}
    return static_int8(weights, sequences), record


def task_sequences(bundle, n: int, split: str = "train") -> list[tuple[np.ndarray, int]]:
    """(prefix + the fp32 target's greedy answer, prefix length) for the first `n` scenes of a
    policy bundle's `split` (the training scenes by default: calibration must not see the test set)."""
    from sol_control.decoding import greedy, open_decoder
    from sol_control.eval import encode_scenes, scenes
    from sol_control.perception import ObservationTokenizer

    m = bundle.manifest
    prefixes, _ = encode_scenes(ObservationTokenizer.from_bundle(bundle), scenes(m.task, split, n))
    sess = open_decoder(bundle, "target", "fp32")
    out = []
    for p in prefixes:
        if p is not None:
            sess.reset()
            answer = greedy(sess, p, len(m.actions)).tokens
            out.append((np.concatenate([p, np.asarray(answer, np.int64)]), len(p)))
    return out
