"""Draft-head data for another target graph of SmolLM2 (dev-only): the prompts of
tools/lm_selfdistill.py answered again by a quantized graph: the int4 graph of an `--int4-mode` such
as "symmetric" (ONNX Runtime GenAI's recipe, which `sol-control bench lm` imports beside the exact
one), or with `--precision int8` the int8 graph (the ultrafast one on CPUs with VNNI).

The heads of `make lm-heads` learn what the fp32 target says, from its hidden states. A re-quantized
target says other things: read teacher-forced over fp32's answers, the symmetric graph's argmax
equals the next token of the text only 71 % of the time (a sample of 8 answers). So heads for it
need its own answers and numbers. Per prompt: its greedy answer (our engine, prompt lookup, up to
the same 160 tokens, cut after a stop id), then one prefill of prompt + answer that gives each
row's final hidden state h (the graph's `final_norm`, as its heads would read it) and argmax b.
b must equal the answer (the graph's rows do not depend on how many tokens share a pass);
`agreement` in meta.json checks it. tools/train_lm_heads.py then reads these shards as it reads
the fp32 ones.

    python tools/lm_selfdistill_graph.py --int4-mode symmetric --out .work/lm/heads_data_symmetric
    python tools/train_lm_heads.py train --data .work/lm/heads_data_symmetric ...

`--chat N` needs no fp32 shards (and no torch): it makes the N chat prompts of
tools/lm_selfdistill.py itself (the same seed, held out from the workload the same way), in shards
of `CHAT_SHARD`. `--heads H.npz` answers through a graph with those draft heads attached: the same
tokens (speculate_heads is lossless), ~2x sooner; the hidden rows come from the graph without them.

    python tools/lm_selfdistill_graph.py --precision int8 --chat 3000 --heads models/lm/smollm2_heads_k3.npz \
        --out .work/lm/heads_data_int8

Shards are written as they are made, one per input shard, and the ones already there are kept.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))

import lm_selfdistill as D  # noqa: E402
from sol_control.graph.llama import QUERY_PAD  # noqa: E402

CONTEXT = 1024  # KV rows of the graph built here: longer than any example (prompt + answer)
LOOKUP = 8  # prompt-lookup guesses while answering (bench lm's "+ lookup" rows)
HIDDEN = "final_norm"  # the graph's last normed hidden state, every row (graph.llama.build_graph)
CHAT_SHARD = 100  # --chat: prompts a shard


def build(gguf: Path, precision: str, int4_mode: str, path: Path, heads: Path | None = None) -> Path:
    """The `precision` graph (int4: of `int4_mode`) as `sol-control import` builds it: without heads
    with its final hidden state as an extra output, else with the draft heads of `heads` attached."""
    import onnx
    from onnx import TensorProto, helper

    from sol_control.graph.llama import BuildOptions, build_graph
    from sol_control.lm.gguf_reader import read_gguf_weights
    from sol_control.lm.importer import attach_heads, graph_inputs, read_heads

    weights, options = graph_inputs(read_gguf_weights(gguf), precision, CONTEXT, int4_mode)
    if heads is not None:
        attach_heads(weights, read_heads(heads), heads)
    model = build_graph(weights, BuildOptions(precision=precision, argmax=True, **options))
    if heads is None:
        size = weights.config.hidden_size
        model.graph.output.append(helper.make_tensor_value_info(HIDDEN, TensorProto.FLOAT, [1, "T", size]))
    onnx.save(model, str(path))
    return path


class TeacherForced:
    """One prefill of a whole sequence a call: (h [T, hidden], argmax [T]) of every row."""

    def __init__(self, path: Path, threads: int):
        import onnxruntime as ort

        from sol_control.decoding.session import session_options

        self.session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
        past = [i for i in self.session.get_inputs() if i.name.startswith("past_key_values.")]
        self.zeros = {i.name: np.zeros(i.shape, np.float32) for i in past}
        self.pad = {i.name: np.ones(1, np.int64) for i in self.session.get_inputs() if i.name == QUERY_PAD}

    def __call__(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        T = len(ids)
        if T >= CONTEXT:
            raise ValueError(f"a sequence of {T} tokens does not fit the graph's {CONTEXT} KV rows")
        feeds = {"input_ids": ids.astype(np.int64)[None], "seqlens_k": np.array([T], np.int32),  # query pad: +1
                 "total_sequence_length": np.array(T + 1, np.int32), "guesses": np.array(T - 1, np.int64),
                 **self.pad, **self.zeros}
        best, h = self.session.run(["argmax", HIDDEN], feeds)
        return h[0], best[0]


class Answerer:
    """The graph's greedy answers (speculate_heads with prompt lookup alone: plain greedy's tokens)."""

    def __init__(self, path: Path, threads: int, stop_ids: tuple[int, ...], max_new: int):
        from sol_control.decoding.adaptive_k import GuessLength
        from sol_control.decoding.fused import FusedDecoderSession

        self.session = FusedDecoderSession(path, threads=threads)
        self.stop_ids, self.max_new, self.length = stop_ids, max_new, GuessLength()

    def __call__(self, prompt: np.ndarray) -> np.ndarray:
        from sol_control.decoding.speculative import speculate_heads

        self.session.reset()
        result = speculate_heads(self.session, prompt, self.max_new, stop_ids=self.stop_ids, lookup=LOOKUP,
                                 length=self.length)
        return np.array(result.tokens, np.int64)


def answer_again(prompts: list[np.ndarray], kinds: list[int], answer: Answerer,
                 model: TeacherForced) -> tuple[D.Examples, int]:
    """The prompts with the graph's own answers and hidden rows (the row of answer token i: the one
    at prompt + i - 1); and how many of the rows' argmaxes equal the answer."""
    answers, hidden, same = [], [], 0
    for prompt in prompts:
        a = answer(prompt)
        h, best = model(np.concatenate([prompt, a[:-1]]))
        same += int((best[len(prompt) - 1:] == a).sum())
        answers.append(a.tolist())
        hidden.append(h[len(prompt) - 1:])
    return D.Examples.build([p.tolist() for p in prompts], answers, kinds, hidden), same


def shard_prompts(args, tok) -> dict[str, tuple[list[np.ndarray], list[int]]]:
    """{shard name: (prompt ids, kinds)}: --data's shards' prompts, or --chat's own in shards of CHAT_SHARD."""
    if not args.chat:
        shards = sorted(args.data.glob("shard_*.npz"))
        if not shards:
            raise SystemExit(f"no shard_*.npz in {str(args.data)!r}: run tools/lm_selfdistill.py first, or "
                             f"give --chat N")
        out = {}
        for shard in shards:
            ex = D.Examples.load(shard)
            out[shard.name] = ([ex.sequence(i)[:int(ex.prompt_len[i])] for i in range(len(ex))], ex.kind.tolist())
        return out
    chats = D.chat_prompts(args.chat, args.seed)
    D.refuse_held_out([m["content"] for c in chats for m in c])
    ids = [np.array(tok.encode_chat(c), np.int64) for c in chats]
    groups = [ids[k:k + CHAT_SHARD] for k in range(0, len(ids), CHAT_SHARD)]
    return {f"shard_{i:03d}.npz": (group, [D.CHAT] * len(group)) for i, group in enumerate(groups)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gguf", type=Path, default=D.GGUF)
    ap.add_argument("--data", type=Path, default=D.DATA, help="tools/lm_selfdistill.py's shards")
    ap.add_argument("--chat", type=int, default=0, help="make N chat prompts here instead of reading --data")
    ap.add_argument("--seed", type=int, default=0, help="--chat's prompts (lm_selfdistill's --seed)")
    ap.add_argument("--precision", choices=("int4", "int8"), default="int4")
    ap.add_argument("--int4-mode", default="symmetric", help="with --precision int4")
    ap.add_argument("--heads", type=Path, default=None, help="answer with these draft heads (faster, same tokens)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-new", type=int, default=160, help="answer budget (lm_selfdistill's --max-new-chat)")
    ap.add_argument("--reverse", action="store_true", help="walk the shards from the last (a second process)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    from sol_control.lm.gguf_reader import open_gguf
    from sol_control.lm.tokenizer import read_gguf_tokenizer

    tok = read_gguf_tokenizer(open_gguf(args.gguf))
    shards = shard_prompts(args, tok)
    with tempfile.TemporaryDirectory() as tmp:
        graph = build(args.gguf, args.precision, args.int4_mode, Path(tmp) / "graph.onnx")
        fast = graph if args.heads is None else build(args.gguf, args.precision, args.int4_mode,
                                                      Path(tmp) / "heads.onnx", args.heads)
        model = TeacherForced(graph, args.threads)
        answer = Answerer(fast, args.threads, tok.stop_ids, args.max_new)
        t0 = time.monotonic()
        for name in (reversed(list(shards)) if args.reverse else shards):
            dst = args.out / name
            if dst.exists():
                continue
            new, same = answer_again(*shards[name], answer, model)
            dst.with_suffix(".json").write_text(json.dumps({"answer_tokens": new.answer_tokens(), "equal": same}))
            part = args.out / f".{name}"  # not a shard_*.npz until complete
            new.save(part)
            part.rename(dst)
            print(f"lm_selfdistill_graph {time.monotonic() - t0:7.1f} s: {name} ({len(new)} answers, "
                  f"{new.answer_tokens()} tokens, {same / new.answer_tokens():.2%} of prefill argmaxes equal them)",
                  flush=True)
    write_meta(args, len(shards))
    return 0


def write_meta(args, n_shards: int) -> None:
    """meta.json once every shard is written: sizes, and how many prefill argmaxes equal the answers."""
    new_shards = sorted(args.out.glob("shard_*.npz"))
    if len(new_shards) < n_shards:
        return  # the other process writes it
    counts = [json.loads(p.with_suffix(".json").read_text()) for p in new_shards]
    tokens = sum(c["answer_tokens"] for c in counts)
    source = {"chat_prompts": args.chat, "seed": args.seed} if args.chat else {"source": str(args.data)}
    graph = {"precision": args.precision, **({"int4_mode": args.int4_mode} if args.precision == "int4" else {})}
    meta = {**source, **graph, "answer_tokens": tokens,
            "agreement": round(sum(c["equal"] for c in counts) / tokens, 6), "max_new": args.max_new,
            "lookup": LOOKUP, "answered_with_heads": str(args.heads) if args.heads else None}
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
