"""Read a Llama decoder's weights back out of our exported fp32 ONNX graph (numpy + onnx only).

The one place that knows how `tools/export.py` (torch dynamo, opset 23) lays a Llama out in ONNX;
`sol_control.lm.hf_from_onnx` (Hugging Face folders for the peer engines and for training) and the
fused graph builder (`sol_control.graph.llama`) both start from `read_decoder`.

Projections become anonymous MatMul inputs (`val_44`, stored as W^T: [in, out]) and identical
initializers are merged (two all-ones norms share one weight, named after the first), so names
cannot be trusted and every weight is identified by the graph around it: a norm followed by three
projections is input_layernorm, q/k/v by the Attention input they reach (0/1/2), o_proj as the
first MatMul after Attention; a norm followed by two is post_attention_layernorm, gate_proj the one
feeding a Sigmoid (SiLU = x * sigmoid(x)), down_proj the MatMul after the gate; the last norm feeds
lm_head (tied when it is the embedding, transposed). The configuration comes from shapes (the
static [1, kv_heads, P, head_dim] past inputs), node attributes (RMS epsilon, attention scale) and
the rotary `inv_freq` table (rope_theta).
"""
from __future__ import annotations

from collections import defaultdict, deque
from pathlib import Path

import numpy as np

from .weights import LlamaConfig, LlamaWeights

NORM_OPS = ("RMSNormalization", "SimplifiedLayerNormalization")


class Graph:
    """An ONNX graph with producer/consumer maps and its initializers as numpy arrays."""

    def __init__(self, path: str | Path):
        import onnx
        from onnx import numpy_helper

        self.path = Path(path)
        self.model = onnx.load(str(path))
        g = self.model.graph
        self.nodes = list(g.node)  # exporters write them in topological order
        self.init = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.inputs = {i.name: i for i in g.input}
        self.producer = {o: n for n in self.nodes for o in n.output}
        self.consumers: dict[str, list] = defaultdict(list)
        for n in self.nodes:
            for i in n.input:
                self.consumers[i].append(n)

    @staticmethod
    def attr(node, name, default=None):
        from onnx import helper

        for a in node.attribute:
            if a.name == name:
                return helper.get_attribute_value(a)
        return default

    def const(self, name: str) -> np.ndarray | None:
        """An initializer, also through Transpose/Identity (a tied lm_head is the embedding transposed)."""
        if name in self.init:
            return self.init[name]
        node = self.producer.get(name)
        if node is not None and node.op_type == "Identity":
            return self.const(node.input[0])
        if node is not None and node.op_type == "Transpose":
            inner = self.const(node.input[0])
            return None if inner is None else np.transpose(inner, self.attr(node, "perm"))
        return None

    def source(self, name: str) -> str:
        """Name of the initializer behind `name` (through Transpose/Identity), for tie detection."""
        node = self.producer.get(name)
        return self.source(node.input[0]) if node is not None and node.op_type in ("Identity", "Transpose") else name

    def matmuls_after(self, tensor: str) -> list:
        return [n for n in self.consumers[tensor] if n.op_type in ("MatMul", "Gemm")]

    def first_forward(self, tensor: str, op_type: str):
        """Breadth-first from `tensor`: the first node of `op_type` and the input slot it is reached on."""
        seen, queue = set(), deque([tensor])
        while queue:
            t = queue.popleft()
            for n in self.consumers[t]:
                if n.op_type == op_type:
                    return n, list(n.input).index(t)
                if id(n) not in seen:
                    seen.add(id(n))
                    queue.extend(n.output)
        return None, None

    def reaches(self, tensor: str, op_type: str, within: int = 2) -> bool:
        frontier = [tensor]
        for _ in range(within):
            nxt = []
            for t in frontier:
                for n in self.consumers[t]:
                    if n.op_type == op_type:
                        return True
                    nxt.extend(n.output)
            frontier = nxt
        return False

    def static_dims(self, name: str) -> list:
        """Dims of a graph input: ints where static, symbol names (str) where dynamic."""
        dims = self.inputs[name].type.tensor_type.shape.dim
        return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]


def linear_weight(g: Graph, matmul) -> np.ndarray:
    """HF nn.Linear weight [out, in] from a MatMul's right input [in, out] (or a Gemm's B)."""
    w = g.const(matmul.input[1])
    if w is None:
        raise ValueError(f"{g.path}: {matmul.name}: weight input {matmul.input[1]!r} is not a constant")
    if matmul.op_type == "Gemm" and g.attr(matmul, "transB", 0):
        return np.ascontiguousarray(w)
    return np.ascontiguousarray(w.T)


def rope_theta(inv_freq: np.ndarray, head_dim: int) -> float:
    """Invert inv_freq[i] = theta ** (-2i / head_dim), then check by recomputing it as
    transformers does (float32); a mismatch means scaled RoPE, which we do not rebuild."""
    est = float(np.exp(-np.log(inv_freq[1:].astype(np.float64)) / (np.arange(2, head_dim, 2) / head_dim)).mean())
    for theta in (float(round(est)), float(f"{est:.6g}"), est):
        redo = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim))
        if np.allclose(redo.astype(np.float32), inv_freq, rtol=1e-6, atol=0):
            return theta
    raise ValueError(f"rotary inv_freq is not plain RoPE (estimated theta {est:.6g}); scaled RoPE is not supported")


def _attention_layer(g: Graph, mms: list, prefix: str, params: dict) -> float | None:
    """q/k/v by the Attention input slot they reach, o_proj after it; returns the attention scale."""
    slots = {}
    for mm in mms:
        attn, slot = g.first_forward(mm.output[0], "Attention")
        if attn is None:
            raise ValueError(f"{g.path}: {prefix}: projection {mm.name} reaches no Attention node")
        slots[slot] = mm
    if sorted(slots) != [0, 1, 2]:
        raise ValueError(f"{g.path}: {prefix}: q/k/v projections not found (Attention slots {sorted(slots)})")
    for slot, proj in enumerate(("q_proj", "k_proj", "v_proj")):
        params[f"{prefix}.self_attn.{proj}.weight"] = linear_weight(g, slots[slot])
    attn = g.first_forward(slots[0].output[0], "Attention")[0]
    o_proj, _ = g.first_forward(attn.output[0], "MatMul")
    params[f"{prefix}.self_attn.o_proj.weight"] = linear_weight(g, o_proj)
    return g.attr(attn, "scale")


def _mlp_layer(g: Graph, mms: list, prefix: str, params: dict) -> None:
    """gate_proj feeds the Sigmoid of SiLU, up_proj is the other one, down_proj follows the gate."""
    gates = [mm for mm in mms if g.reaches(mm.output[0], "Sigmoid", within=1)]
    ups = [mm for mm in mms if mm not in gates]
    if len(gates) != 1 or len(ups) != 1:
        raise ValueError(f"{g.path}: {prefix}: gate/up projections not found")
    down, _ = g.first_forward(gates[0].output[0], "MatMul")
    params[f"{prefix}.mlp.gate_proj.weight"] = linear_weight(g, gates[0])
    params[f"{prefix}.mlp.up_proj.weight"] = linear_weight(g, ups[0])
    params[f"{prefix}.mlp.down_proj.weight"] = linear_weight(g, down)


def _kv_shape(g: Graph) -> tuple[int, int]:
    """(n_kv_heads, head_dim) from the static dims of past_key_values.0.key [1, H, P, D]."""
    name = "past_key_values.0.key"
    if name not in g.inputs:
        raise ValueError(f"{g.path}: no input {name!r} (decoder-with-past layout expected)")
    dims = g.static_dims(name)
    if len(dims) != 4 or not isinstance(dims[1], int) or not isinstance(dims[3], int):
        raise ValueError(f"{g.path}: {name} must be [1, kv_heads, past, head_dim] with static heads and "
                         f"head_dim, got {dims}")
    return dims[1], dims[3]


def read_decoder(path: str | Path, max_context: int = 2048) -> LlamaWeights:
    """The weights and configuration of one fp32 decoder-with-past ONNX file from `tools/export.py`.
    `max_context` is not in the graph (rotary positions work at any length): give the manifest's."""
    g = Graph(path)
    n_kv, head_dim = _kv_shape(g)
    embed_name = next((n for n in g.init if n.endswith("embed_tokens.weight")), None)
    if embed_name is None:
        raise ValueError(f"{g.path}: no embed_tokens.weight initializer")
    params: dict[str, np.ndarray] = {"model.embed_tokens.weight": g.init[embed_name]}
    norms = [n for n in g.nodes if n.op_type in NORM_OPS]
    eps = {float(g.attr(n, "epsilon", 1e-5)) for n in norms}
    if len(eps) != 1:
        raise ValueError(f"{g.path}: RMS norms disagree on epsilon: {eps}")
    # Norms are told apart by what follows them, not by their weight's name (merged initializers).
    n_layers, scale, final_norm = 0, None, None
    for norm in norms:
        w, mms = g.init[norm.input[1]], g.matmuls_after(norm.output[0])
        if len(mms) == 3:  # input_layernorm -> q, k, v
            prefix, n_layers = f"model.layers.{n_layers}", n_layers + 1
            params[f"{prefix}.input_layernorm.weight"] = w
            scale = _attention_layer(g, mms, prefix, params)
        elif len(mms) == 2 and n_layers:  # post_attention_layernorm -> gate (SiLU), up
            prefix = f"model.layers.{n_layers - 1}"
            params[f"{prefix}.post_attention_layernorm.weight"] = w
            _mlp_layer(g, mms, prefix, params)
        elif len(mms) == 1 and norm is norms[-1]:  # final norm -> lm_head
            params["model.norm.weight"] = w
            final_norm = norm
        else:
            raise ValueError(f"{g.path}: norm {norm.name} is followed by {len(mms)} projections; not a Llama layout")
    if final_norm is None:
        raise ValueError(f"{g.path}: no final norm")
    (lm_head,) = g.matmuls_after(final_norm.output[0])
    tied = g.source(lm_head.input[1]) == embed_name
    if not tied:
        params["lm_head.weight"] = linear_weight(g, lm_head)
    if scale is not None and abs(scale - head_dim ** -0.5) > 1e-6:
        raise ValueError(f"{g.path}: attention scale {scale} is not 1/sqrt(head_dim={head_dim})")
    inv_freq = next((a for n, a in g.init.items() if n.endswith("rotary_emb.inv_freq")), None)
    if inv_freq is None:
        raise ValueError(f"{g.path}: no rotary inv_freq table")
    vocab, hidden = params["model.embed_tokens.weight"].shape
    config = LlamaConfig(
        vocab_size=int(vocab), hidden_size=int(hidden),
        intermediate_size=int(params["model.layers.0.mlp.gate_proj.weight"].shape[0]),
        n_layers=n_layers, n_heads=params["model.layers.0.self_attn.q_proj.weight"].shape[0] // head_dim,
        n_kv_heads=n_kv, head_dim=head_dim, rope_theta=rope_theta(inv_freq, head_dim),
        # float32 epsilon read back as the short decimal it came from (9.9999997e-06 -> 1e-05)
        rms_norm_eps=float(str(np.float32(eps.pop()))), max_context=max_context, tie_embeddings=tied)
    weights = LlamaWeights(config, params)
    try:
        weights.validate()
    except ValueError as e:
        raise ValueError(f"{g.path}: {e}") from None
    return weights


def _branches(graph) -> list:
    """The subgraphs of a graph's `If` nodes (a fused graph's heads sit in the `heads_on` switch's)."""
    return [a.g for node in graph.node if node.op_type == "If" for a in node.attribute
            if a.name in ("then_branch", "else_branch")]


def initializers(model) -> dict:
    """Name -> TensorProto of a graph's initializers and of its `If` branches'."""
    init = {t.name: t for t in model.graph.initializer}
    for branch in _branches(model.graph):
        init.update({t.name: t for t in branch.initializer})
    return init


def all_nodes(graph) -> list:
    """A graph's nodes and its `If` branches' nodes (the `If` nodes too)."""
    return [*graph.node, *(n for branch in _branches(graph) for n in all_nodes(branch))]


def read_heads(path: str | Path) -> "DraftHeads | None":
    """The draft heads written into one of our fp32 fused graphs (`sol_control.graph.llama`), as the
    `DraftHeads` they were built from; None for a graph without heads. So a bundle's quantized graphs
    can be rebuilt from the bundle alone (tools/make_models.py --refresh-graphs)."""
    import onnx
    from onnx import numpy_helper

    from .weights import DraftHeads

    model = onnx.load(str(path))
    meta = {p.key: p.value for p in model.metadata_props}
    k = int(meta.get("draft_heads", "0"))
    if not k:
        return None
    if meta.get("precision") != "fp32":
        raise ValueError(f"{path}: heads are read back from an fp32 fused graph, this one is {meta.get('precision')}")
    init = initializers(model)
    w1 = numpy_helper.to_array(init["heads.w1"])  # [H, K*H] = w1.transpose(2, 0, 1).reshape(H, K*H)
    hidden = w1.shape[0]
    w1 = np.ascontiguousarray(w1.reshape(hidden, k, hidden).transpose(1, 2, 0))
    if "heads.w2" not in init:  # heads through the lm_head, perhaps chained (w_prev)
        if "heads.w_prev.0.T" not in init:
            return DraftHeads(w1, None, 0)
        w_prev = np.stack([numpy_helper.to_array(init[f"heads.w_prev.{j}.T"]).T for j in range(k)])
        return DraftHeads(w1, None, 0, np.ascontiguousarray(w_prev))
    w2 = np.ascontiguousarray(numpy_helper.to_array(init["heads.w2"]).transpose(0, 2, 1))  # [K, n_out, H]
    return DraftHeads(w1, w2, int(numpy_helper.to_array(init["heads.offset"]).reshape(-1)[0]))
