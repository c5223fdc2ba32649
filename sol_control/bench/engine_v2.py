"""Engine v2 measurements: the fused graph (sol_control.graph.llama) against today's export and
ONNX Runtime GenAI on the same weights, per runtime call and per decision, in alternating rounds.

Variants (all from the bundle's fp32 target weights, one ORT thread unless --threads):
    export fp32 (/ int4 / int8)    DecoderSession on the bundle's Optimum-layout files
    fused fp32 / int4 / int8       FusedDecoderSession on graphs built here by build_decoder (query pad
                                   on: one-token rows equal verify rows), int4 also with blocks of 128
    fused int4 no pad              the same graph without the query pad
    ... exact                      min_step_tokens=2 (every pass >= 2 rows: exact mode)
    ..., lean loop                 greedy without per-token probabilities/stats (the loop's own cost)
    genai-graph int4 / fp32        ORT GenAI's builder graph run by plain onnxruntime (shared KV
                                   buffer, attention_mask), through `GenAIGraphSession` below
    bundle int4/int8 + heads[, warm]  the shipped fused files, speculating with their draft heads;
                                   warm keeps the previous frame's cache (static-first prefix reuse)
    og.Generator int4              ORT GenAI's own loop (`sol_control.bench.peers.ort_genai.genai_decide`)
The GenAI rows need `onnxruntime_genai` (dev extra) to build their graphs; they are skipped without it.

    python -m sol_control.bench.engine_v2 [--bundle models/grasp] [--rounds 9] [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import numpy as np

from ..decoding.session import DecoderSession, _fast_binding, session_options
from .common import REPO, default_bundle, table

WORK = REPO / ".work" / "engine_v2"
CALL_SIZES = (1, 5, 16)  # tokens per call after an 18-token prefix; plus "prefill" (18 from empty)


class GenAIGraphSession:
    """ORT GenAI's builder graph run by plain onnxruntime: past and present bound to one buffer of
    C positions, attention_mask [1, L+T] of ones (the graph turns it into GQA's lengths). Just the
    interface `greedy` needs; a benchmark aid, not a runtime path."""

    def __init__(self, path: Path, max_context: int, threads: int = 1, min_step_tokens: int = 1, name: str = ""):
        import onnxruntime as ort

        self.name, self.path, self.max_context = name or path.stem, path, max_context
        self.session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
        inputs = {i.name: i for i in self.session.get_inputs()}
        self.n_layers = sum(n.startswith("past_key_values.") for n in inputs) // 2
        H, D = inputs["past_key_values.0.key"].shape[1], self._head_dim(path)
        self.vocab = self.session.get_outputs()[0].shape[-1]
        self.max_step_tokens, self.min_step_tokens = max_context, min_step_tokens
        self._kv = np.zeros((2 * self.n_layers, H * max_context * D), np.float32)
        self._ones = np.ones(max_context, np.int64)
        self._ids = np.zeros(max_context, np.int64)
        self._logits = np.zeros(max_context * self.vocab, np.float32)
        self.tokens, self.length, self.calls, self._pair = np.zeros(max_context, np.int64), 0, 0, np.zeros(2, np.int64)
        self._io = self.session.io_binding()
        self._bind_in, self._bind_out, self._run_bound = _fast_binding(self.session, self._io)
        f32 = np.dtype(np.float32)
        for j in range(2 * self.n_layers):
            name, ptr = f"{j // 2}.{('key', 'value')[j % 2]}", int(self._kv[j].ctypes.data)
            self._bind_in(f"past_key_values.{name}", f32, (1, H, max_context, D), ptr)
            self._bind_out(f"present.{name}", f32, (1, H, max_context, D), ptr)

    @staticmethod
    def _head_dim(path: Path) -> int:
        config = json.loads((path.parent / "genai_config.json").read_text())
        return config["model"]["decoder"]["head_size"]

    def reset(self) -> None:
        self.length = 0

    def rewind(self, n_keep: int) -> None:
        self.length = n_keep

    forward = DecoderSession.forward  # exact-mode pairs and prefix reuse over `_run`, as ours
    prefill = DecoderSession.prefill

    def _run(self, ids: np.ndarray) -> np.ndarray:
        T, L, V = len(ids), self.length, self.vocab
        self._ids[:T] = ids
        self._bind_in("input_ids", np.dtype(np.int64), (1, T), int(self._ids.ctypes.data))
        self._bind_in("attention_mask", np.dtype(np.int64), (1, L + T), int(self._ones.ctypes.data))
        self._bind_out("logits", np.dtype(np.float32), (1, T, V), int(self._logits.ctypes.data))
        self._run_bound()
        self.calls += 1
        self.tokens[L:L + T] = ids
        self.length = L + T
        return self._logits[: T * V].reshape(T, V)


# ---- building every graph ------------------------------------------------------------------------

def build_graphs(bundle, work: Path = WORK) -> dict[str, Path]:
    """{variant name: ONNX path} for the export's files, our fused graphs and (if possible) GenAI's."""
    from ..graph.from_onnx import read_decoder
    from ..graph.llama import build_decoder

    m = bundle.manifest
    paths = {f"export {p}": bundle.verify(f) for p, f in m.target.files.items()}
    weights = read_decoder(paths["export fp32"], m.max_context)
    out = work / m.name
    for p in ("fp32", "int4", "int8"):
        paths[f"fused {p}"] = build_decoder(weights, out / f"fused_{p}.onnx", p)
    paths["fused int4 b128"] = build_decoder(weights, out / "fused_int4_b128.onnx", "int4", block_size=128)
    paths["fused int4 no pad"] = build_decoder(weights, out / "fused_int4_nopad.onnx", "int4", query_pad=False)
    paths.update(genai_graphs(bundle, out))
    return paths


def genai_graphs(bundle, out: Path) -> dict[str, Path]:
    """ORT GenAI builder folders for the bundle's target (fp32 and its int4), if the builder is here."""
    try:
        import onnxruntime_genai  # noqa: F401
    except ImportError:
        print("note: onnxruntime_genai not installed (make venv-train): GenAI rows skipped", file=sys.stderr)
        return {}
    from .peers import hf_folders
    from .peers.ort_genai import genai_convert

    hf_target, _ = hf_folders(bundle)
    return {f"genai-graph {p}": genai_convert(hf_target, out / f"genai_{p}", p, threads=1) / "model.onnx"
            for p in ("fp32", "int4")}


def node_counts(paths: dict[str, Path]) -> dict[str, dict]:
    """Nodes as written and after ONNX Runtime's optimizations (what actually runs)."""
    import onnx
    import onnxruntime as ort

    counts = {}
    for name, path in paths.items():
        written = onnx.load(str(path), load_external_data=False).graph.node
        opts = session_options(1)
        opts.optimized_model_filepath = str(WORK / "optimized.onnx")
        opts.log_severity_level = 3  # no warning about serializing hardware-specific optimizations
        ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        ran = onnx.load(opts.optimized_model_filepath, load_external_data=False).graph.node
        counts[name] = {"written": len(written), "optimized": len(ran),
                        "ops": dict(collections.Counter(n.op_type for n in ran).most_common())}
    return counts


def open_session(name: str, path: Path, max_context: int, threads: int):
    from ..decoding import DecoderSession
    from ..decoding.fused import FusedDecoderSession

    exact = 2 if name.endswith(" exact") else 1
    if name.startswith("export"):
        return DecoderSession(path, max_context, threads=threads, name=name, min_step_tokens=exact)
    if name.startswith("fused"):
        return FusedDecoderSession(path, threads=threads, name=name, min_step_tokens=exact)
    return GenAIGraphSession(path, max_context, threads=threads, name=name, min_step_tokens=exact)


def sessions(paths: dict[str, Path], max_context: int, threads: int, exact: tuple[str, ...]) -> dict:
    out = {}
    for name, path in paths.items():
        out[name] = open_session(name, path, max_context, threads)
        if name in exact:
            out[name + " exact"] = open_session(name + " exact", path, max_context, threads)
    return out


# ---- measuring -----------------------------------------------------------------------------------

def time_call(sess, prefix: np.ndarray, T: int, rng, n: int = 50) -> tuple[float, float]:
    """Median (wall µs, thread-CPU µs) of one forward of T new tokens after `prefix` is cached
    (T=0: the prefill itself)."""
    wall, cpu = [], []
    for _ in range(n):
        sess.reset()
        ids = rng.integers(4, sess.vocab - 8, T) if T else prefix
        if T:
            sess.forward(prefix)
        c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
        sess.forward(ids)
        wall.append(time.perf_counter_ns() - t0)
        cpu.append(time.thread_time_ns() - c0)
    return float(np.median(wall)) / 1e3, float(np.median(cpu)) / 1e3


def per_call(sess_by_name: dict, prefix: np.ndarray, rounds: int) -> tuple[dict, dict]:
    """{variant: {"prefill": µs, 1: µs, 5: µs, 16: µs}} in wall and in thread-CPU time: medians over
    rounds, variants interleaved."""
    rng = np.random.default_rng(0)
    samples = collections.defaultdict(list)
    for _ in range(rounds):
        for name, sess in sess_by_name.items():
            for T in (0,) + CALL_SIZES:
                samples[(name, T)].append(time_call(sess, prefix, T, rng))
    key = lambda T: "prefill" if T == 0 else T
    return tuple({name: {key(T): float(np.median([s[i] for s in samples[(name, T)]])) for T in (0,) + CALL_SIZES}
                  for name in sess_by_name} for i in (0, 1))


def decide_fn(sess, new_tokens: int):
    """decide(prefix) -> tokens: one decision from a cold cache (a new frame)."""
    from ..decoding import greedy

    def decide(prefix):
        sess.reset()
        return greedy(sess, prefix, new_tokens).tokens
    return decide


def heads_deciders(bundle, new_tokens: int, threads: int) -> dict:
    """The shipped fused files with their draft heads, as the node runs them: cold (a reset per
    decision, as every other row here) and warm (the cache kept from the previous frame, so a
    static-first prefix is not computed again)."""
    from ..decoding import open_decoder, speculate_heads

    out = {}
    if not bundle.manifest.target.draft_heads:
        return out
    for prec in ("int4", "int8"):
        for warm in (False, True):
            sess = open_decoder(bundle, "target", prec, threads, name=f"bundle {prec} + heads")

            def decide(prefix, sess=sess, warm=warm):
                if not warm:
                    sess.reset()
                return speculate_heads(sess, prefix, new_tokens).tokens
            out[f"bundle {prec} + heads{', warm' if warm else ''}"] = decide
    return out


def og_reused_decide(model_dir: Path, max_context: int, new_tokens: int):
    """ORT GenAI's own loop, one Generator kept across decisions (`rewind_to(0)`, as a node would
    keep it): creating a Generator per decision costs ~12 ms here, far more than the decision."""
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_context, do_sample=False)
    gen = og.Generator(model, params)

    def decide(prefix):
        gen.rewind_to(0)
        gen.append_tokens(np.asarray(prefix, np.int32))
        for _ in range(new_tokens):  # each picks a token from the last logits, then runs the model lazily
            gen.generate_next_token()
        out = list(gen.get_sequence(0))[len(prefix):]
        assert len(out) == new_tokens, (len(out), new_tokens)
        return out
    return decide


def lean_decide(sess, new_tokens: int):
    """Greedy without the per-token probabilities, budget checks and stats of `greedy`: what the
    Python loop costs on top of the runtime calls."""
    step = np.zeros(1, np.int64)

    def decide(prefix):
        sess.reset()
        out = [int(sess.prefill(prefix).argmax())]
        while len(out) < new_tokens:
            step[0] = out[-1]
            out.append(int(sess.forward(step)[0].argmax()))
        return out
    return decide


def per_decision(deciders: dict, prefixes: list, rounds: int) -> tuple[dict, dict]:
    """({variant: per-round median wall ms per decision}, the same in CPU ms of this thread), every
    decision of a round run for every variant in turn (A B C A B C ...). With one intra-op thread
    ORT computes on the calling thread, so its CPU time is what the decision costs when nothing
    preempts it: on a shared machine that is the steadier figure."""
    for d in deciders.values():  # warm up: first runs allocate
        d(prefixes[0])
    wall, cpu = {name: [] for name in deciders}, {name: [] for name in deciders}
    for _ in range(rounds):
        w, c = {name: [] for name in deciders}, {name: [] for name in deciders}
        for prefix in prefixes:
            for name, decide in deciders.items():
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                decide(prefix)
                w[name].append((time.perf_counter_ns() - t0) / 1e6)
                c[name].append((time.thread_time_ns() - c0) / 1e6)
        for name in deciders:
            wall[name].append(float(np.median(w[name])))
            cpu[name].append(float(np.median(c[name])))
    return wall, cpu


def agreement(deciders: dict, prefixes: list, reference: str) -> dict:
    """Per variant: share of decisions / tokens equal to the reference variant's (one pass, untimed)."""
    outputs = {name: [list(map(int, d(p))) for p in prefixes] for name, d in deciders.items()}
    ref = outputs[reference]
    out = {}
    for name, outs in outputs.items():
        tokens = [a == b for o, r in zip(outs, ref) for a, b in zip(o, r)]
        out[name] = {"decisions": float(np.mean([o == r for o, r in zip(outs, ref)])), "tokens": float(np.mean(tokens))}
    return out


def row_identity(sess, prefixes: list, k: int = 4) -> dict:
    """Are the logits rows of a T=k+1 pass bit-identical to the same positions decoded one token at a
    time? Share of identical rows and the largest difference."""
    same, worst = [], 0.0
    for prefix in prefixes:
        sess.reset()
        toks, singles = [int(sess.prefill(prefix).argmax())], []
        for _ in range(k):
            singles.append(sess.forward(np.array(toks[-1:], np.int64))[0].copy())
            toks.append(int(singles[-1].argmax()))
        sess.rewind(len(prefix))
        multi = sess.forward(np.array(toks, np.int64))  # [k+1, V]; rows 0..k-1 are the singles' positions
        same += [np.array_equal(multi[i], singles[i]) for i in range(k)]
        worst = max(worst, float(np.abs(multi[:k] - np.stack(singles)).max()))
    return {"identical": float(np.mean(same)), "max_abs_diff": worst}


# ---- the run -------------------------------------------------------------------------------------

EXACT = ("export fp32", "export int4", "export int8", "fused int4 b128", "fused int4 no pad", "genai-graph int4")


def run_bench(bundle, rounds: int, decisions: int, threads: int, agreement_n: int = 200) -> dict:
    from .decode_bench import decision_prefixes

    m = bundle.manifest
    paths = build_graphs(bundle)
    sess = sessions(paths, m.max_context, threads, EXACT)
    prefixes = decision_prefixes(bundle, decisions)
    new_tokens = len(m.actions) or 15
    deciders = {name: decide_fn(s, new_tokens) for name, s in sess.items()}
    for name in ("fused int4", "fused int4 b128 exact"):
        deciders[f"{name}, lean loop"] = lean_decide(sess[name], new_tokens)
    deciders.update(heads_deciders(bundle, new_tokens, threads))
    if "genai-graph int4" in paths:
        from .peers.ort_genai import genai_decide

        og_decide = genai_decide(paths["genai-graph int4"].parent, new_tokens)  # as the peer bench runs it
        deciders["og.Generator int4 (new)"] = lambda prefix: og_decide([int(t) for t in prefix])[0]
        deciders["og.Generator int4"] = og_reused_decide(paths["genai-graph int4"].parent, m.max_context, new_tokens)
    with bundle.load_array("reference.npz") as z:
        ref_prefixes = [ids[: int(z["prefix_len"])] for ids in z["ids"]]
    return {
        "bundle": m.name, "threads": threads, "rounds": rounds, "decisions": len(prefixes),
        "new_tokens": new_tokens, "prefix_len": len(prefixes[0]),
        "nodes": node_counts(paths),
        **dict(zip(("per_call_us", "per_call_cpu_us"), per_call(sess, prefixes[0], rounds))),
        **dict(zip(("per_decision_ms", "per_decision_cpu_ms"), per_decision(deciders, prefixes, rounds))),
        "load": __import__("os").getloadavg()[0],
        "row_identity": {name: row_identity(s, prefixes[:12]) for name, s in sess.items()},
        "agreement_reference_prefixes": agreement(deciders, ref_prefixes, "export fp32"),
        "agreement_test_prefixes": agreement(deciders, decision_prefixes(bundle, agreement_n, seed=1000),
                                             "export fp32"),
    }


def print_report(rep: dict) -> None:
    print(f"\nbundle {rep['bundle']}: {rep['threads']} thread(s), {rep['rounds']} rounds, {rep['decisions']} decisions "
          f"of prefill {rep['prefix_len']} + {rep['new_tokens'] - 1} greedy steps")
    for title, key in (("per call, wall µs", "per_call_us"), ("per call, thread-CPU µs", "per_call_cpu_us")):
        calls = rep[key]
        base = calls.get("genai-graph int4")
        print(f"\n{title} (T new tokens after the {rep['prefix_len']}-token prefix; prefill = those {rep['prefix_len']})")
        print(table(["variant", "prefill", "T=1", "T=5", "T=16", "T=1 vs genai-graph int4"],
                    [[n, f"{c['prefill']:.0f}", f"{c[1]:.0f}", f"{c[5]:.0f}", f"{c[16]:.0f}",
                      f"{base[1] / c[1]:.2f}x" if base else "-"] for n, c in calls.items()]))
    wall, cpu = rep["per_decision_ms"], rep["per_decision_cpu_ms"]
    print(f"\nper decision (load average {rep['load']:.2f} at the end): wall ms, and CPU ms of the deciding thread")
    print(table(["variant", "wall p50", "min-max", "CPU p50", "vs og.Generator int4 (CPU)"],
                [[n, f"{np.median(v):.2f}", f"{min(v):.2f}-{max(v):.2f}", f"{np.median(cpu[n]):.2f}",
                  _ratio(cpu, "og.Generator int4", n)] for n, v in wall.items()]))
    print()
    head = ["variant", "nodes written", "after ORT opt", "rows T=k+1 == T=1", "max |diff|", "= fp32 (ref)", "= fp32 (test)"]
    rows = []
    for n in rep["per_decision_ms"]:
        c, r = rep["nodes"].get(n.removesuffix(" exact")), rep["row_identity"].get(n)
        a, b = rep["agreement_reference_prefixes"][n], rep["agreement_test_prefixes"][n]
        rows.append([n, str(c["written"]) if c else "-", str(c["optimized"]) if c else "-",
                     f"{r['identical']:.2f}" if r else "-", f"{r['max_abs_diff']:.2g}" if r else "-",
                     f"{a['tokens']:.3f}", f"{b['tokens']:.3f} ({b['decisions']:.2f})"])
    print(table(head, rows))


def _ratio(d: dict, base: str, name: str) -> str:
    """Median over rounds of base_ms / name_ms (same round): > 1 means `name` is faster."""
    if base not in d:
        return "-"
    return f"{np.median(np.array(d[base]) / np.array(d[name])):.2f}x"


def main(argv: list[str] | None = None) -> int:
    from ..bundle import Bundle

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, default=None, help="default: models/grasp")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--decisions", type=int, default=20, help="decision prefixes per round")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    bundle = Bundle.load(args.bundle or default_bundle())
    rep = run_bench(bundle, args.rounds, args.decisions, args.threads)
    print_report(rep)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rep, indent=1, default=str))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
