"""`sol-control generate --bundle B --chat TEXT`: greedy text from a language model bundle.

Plain greedy with the target alone (`--no-draft`, or a bundle without a draft), or speculative:
with the bundle's draft decoder (`decoding.speculate`), the target's own draft heads
(`decoding.speculate_heads`), or prompt lookup alone (`--lookup N` on a bundle with neither); all
give exactly plain greedy's tokens. Generation ends after a stop id (the manifest's
`vocab.stop_ids`, included in the output) or `--max-new-tokens`.

Plain decoding streams token by token. The speculative engine returns a whole answer, so its text
is printed at the end; it stops at the first stop id too (accepted guesses past it are dropped).

Times: TTFT = from the call to the first token (prefill + argmax); decode tokens/s = tokens after
the first / the time after the first; mean accepted = tokens per target decoding pass (1.0 plain).
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from sol_control.bundle import Bundle
from sol_control.lm.tokenizer import LMTokenizer


@dataclass
class Generation:
    tokens: list[int]  # generated ids, the stop id included when one ended the answer
    ttft_ms: float
    decode_ms: float  # after the first token
    mean_accepted: float  # tokens per target decoding pass
    stopped: bool  # ended on a stop id (else on max_new_tokens)
    mode: str  # "plain", "draft", "heads" or "lookup"
    precision: str = "fp32"
    prefill_precision: str = "fp32"  # the graph that prefilled the prompt
    backend: str = "onnxruntime"  # what ran the target's decoding calls: "native" or "onnxruntime"
    backend_info: dict | None = None  # the target session's: why that backend, the times measured

    @property
    def decode_tokens_per_s(self) -> float:
        n = len(self.tokens) - 1
        return n / self.decode_ms * 1e3 if n > 0 and self.decode_ms > 0 else math.nan


def load_tokenizer(bundle: Bundle) -> LMTokenizer | None:
    """The bundle's tokenizer (sha256-checked files), None when the manifest lists none."""
    from tokenizers import Tokenizer

    spec = bundle.manifest.tokenizer
    if spec is None:
        return None
    template = bundle.path(spec.chat_template).read_text() if spec.chat_template else None
    return LMTokenizer(Tokenizer.from_file(str(bundle.path(spec.file))), bundle.manifest.vocab.stop_ids,
                       template, spec.bos_token, spec.eos_token)


def _ms(t0_ns: int) -> float:
    return (time.monotonic_ns() - t0_ns) / 1e6


def plain_greedy(target, prefix: np.ndarray, max_new_tokens: int, stop_ids: tuple[int, ...],
                 on_token: Callable[[int], None] = lambda t: None) -> Generation:
    """Argmax each step until a stop id or max_new_tokens; `on_token` sees each id as it comes."""
    t0 = time.monotonic_ns()
    target.use_heads(False)  # plain decoding reads no guesses
    token = int(np.argmax(target.prefill(prefix)))  # prefill: the last prefix row's logits [vocab]
    ttft_ms, tokens = _ms(t0), [token]
    on_token(token)
    while token not in stop_ids and len(tokens) < max_new_tokens:
        token = int(np.argmax(target.forward(np.array([token], np.int64))[-1]))
        tokens.append(token)
        on_token(token)
    wall_ms = _ms(t0)
    return Generation(tokens, ttft_ms, wall_ms - ttft_ms, 1.0 if len(tokens) > 1 else 0.0,
                      tokens[-1] in stop_ids, "plain")


def speculative(target, draft, prefix: np.ndarray, max_new_tokens: int, stop_ids: tuple[int, ...],
                lookup: int = 0) -> Generation:
    """Greedy speculative decoding (draft decoder, or the target's draft heads when `draft` is None,
    with prompt-lookup guesses where the text repeats when `lookup` > 0; lookup alone on a target
    without heads)."""
    from sol_control.decoding import GuessLength, speculate, speculate_heads

    result = (speculate_heads(target, prefix, max_new_tokens, stop_ids=stop_ids, lookup=lookup, length=GuessLength())
              if draft is None
              else speculate(draft, target, prefix, max_new_tokens, k=None, stop_ids=stop_ids))
    s, tokens = result.stats, result.tokens
    mode = "draft" if draft is not None else "heads" if target.draft_heads else "lookup"
    return Generation(tokens, s.ttft_ms, s.wall_ms - s.ttft_ms, s.mean_accepted, tokens[-1] in stop_ids, mode)


AUTO = "auto"  # --precision: the fastest quantized graph for this CPU (decoding.factory.fast_precision)


def generate(bundle: Bundle, prefix: list[int], max_new_tokens: int, precision: str | None = None,
             use_draft: bool = True, threads: int = 1,
             on_token: Callable[[int], None] = lambda t: None, lookup: int = 0,
             prefill_precision: str | None = None, backend: str | None = None) -> Generation:
    """Greedy tokens after `prefix` from a verified bundle; speculative when it has a draft (or
    draft heads, or `lookup` > 0) and `use_draft`. `precision` "auto": `fast_precision`'s choice for
    this CPU. The prompt is prefilled through `prefill_precision`'s graph (default: `default_prefill`'s,
    int8 for an int4 target where that prefills faster on this CPU). `backend`: open_decoder's."""
    from sol_control.decoding import open_decoder
    from sol_control.decoding.factory import default_prefill, fast_precision, reference_precision

    m = bundle.manifest
    precision = fast_precision(bundle) if precision == AUTO else precision or reference_precision(m.target)
    if precision not in m.target.precisions:
        raise ValueError(f"--precision {precision!r}: the bundle's target has {list(m.target.precisions)}")
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be positive, got {max_new_tokens}")
    ids = np.asarray(prefix, np.int64)
    if len(ids) == 0:
        raise ValueError("the prompt is empty (no token ids)")
    if ids.min() < 0 or ids.max() >= m.vocab.size:
        raise ValueError(f"prompt ids must lie in [0, {m.vocab.size}), got [{ids.min()}, {ids.max()}]")
    if len(ids) + max_new_tokens > m.max_context:
        raise ValueError(f"prompt {len(ids)} + {max_new_tokens} new tokens exceed max_context={m.max_context}")
    prefill = prefill_precision or default_prefill(bundle, "target", precision)
    target = open_decoder(bundle, "target", precision, threads=threads, prefill_precision=prefill, backend=backend)
    stops = m.vocab.stop_ids
    if use_draft and m.draft is not None:
        draft_precision = precision if precision in m.draft.precisions else m.draft.precisions[0]
        draft = open_decoder(bundle, "draft", draft_precision, threads=threads)
        gen = speculative(target, draft, ids, max_new_tokens, stops)
    elif use_draft and (lookup or (m.target.draft_heads and m.target.fused.get(precision))):
        gen = speculative(target, None, ids, max_new_tokens, stops, lookup)
    else:
        gen = plain_greedy(target, ids, max_new_tokens, stops, on_token)
    info = target.backend_info
    gen.precision, gen.backend, gen.backend_info = precision, info["backend"], info
    # the prefill graph ran unless open_decoder measured the C pass's own prefill faster
    gen.prefill_precision = prefill if prefill and info["prefill"] == "onnxruntime" else precision
    return gen


class TextStream:
    """Prints the text of the ids seen so far as it grows (whole characters only)."""

    def __init__(self, tok: LMTokenizer | None, out=None):
        # sys.stdout is looked up now, not at import: a test harness or a caller may have replaced it since
        self.tok, self.out, self.ids, self.printed = tok, out or sys.stdout, [], ""

    def __call__(self, token: int) -> None:
        self.ids.append(token)
        if self.tok is None:
            return
        text = self.tok.decode(self.ids, skip_special=True)
        if not text.endswith("\ufffd"):  # a character cut inside its UTF-8 bytes waits for the rest
            self.out.write(text[len(self.printed):])
            self.out.flush()
            self.printed = text


def prompt_ids(args, tok: LMTokenizer | None) -> list[int]:
    if args.prompt_ids is not None:
        try:
            return [int(t) for t in args.prompt_ids.split(",") if t.strip()]
        except ValueError:
            raise ValueError(f"--prompt-ids takes comma-separated integers, got {args.prompt_ids!r}") from None
    if tok is None:
        raise ValueError("the bundle has no tokenizer: give --prompt-ids")
    if args.chat is not None:
        return tok.encode_chat([{"role": "user", "content": args.chat}])
    return tok.encode(args.prompt)


def add_arguments(p) -> None:
    p.add_argument("--bundle", required=True, help="a language model bundle (sol-control import)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="plain text, continued as it is")
    what.add_argument("--chat", help="a user message, rendered with the bundle's chat template")
    what.add_argument("--prompt-ids", help="token ids, comma separated")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--no-draft", action="store_true", help="plain greedy even when the bundle has a draft")
    p.add_argument("--precision", choices=("fp32", "int8", "int4", AUTO), default=None,
                   help="the target's precision (default fp32); auto: the bundle's fastest quantized graph "
                        "on this CPU (int4 where the native pass runs, else int8 with VNNI, else int4)")
    p.add_argument("--prefill-precision", choices=("fp32", "int8", "int4"), default=None,
                   help="the graph that prefills the prompt (default: int8 for an int4 target when the bundle "
                        "has it, except on x86 CPUs without VNNI, else the target's own); with --backend auto on "
                        "the native pass, only where it measured faster than the C pass's own prefill")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    p.add_argument("--backend", choices=("auto", "native", "onnxruntime"), default=None,
                   help="what runs the target (default SOL_CONTROL_BACKEND, else auto: for the graphs the native "
                        "C pass computes, both timed once per host and the C pass kept unless ONNX Runtime is 10%% "
                        "faster; ONNX Runtime for the rest)")
    p.add_argument("--lookup", type=int, default=0,
                   help="up to N prompt-lookup guesses where the text repeats (0 = off): beside the draft "
                        "heads, or alone on a bundle with neither heads nor a draft model")
    p.add_argument("--json", default=None, help="write tokens, ttft_ms, decode_tokens_per_s, mean_accepted here")


def run(args) -> int:
    bundle = Bundle.load(args.bundle)
    tok = load_tokenizer(bundle)
    ids = prompt_ids(args, tok)
    stream = TextStream(tok)
    if not 0 <= args.lookup <= 32:
        raise ValueError(f"--lookup must be in 0..32, got {args.lookup}")
    gen = generate(bundle, ids, args.max_new_tokens, args.precision, not args.no_draft, args.threads, stream,
                   args.lookup, args.prefill_precision, args.backend)
    if gen.mode != "plain":  # the speculative engine returns the whole answer
        for token in gen.tokens:
            stream(token)
    if tok is None:
        print(",".join(str(t) for t in gen.tokens))
    tps = gen.decode_tokens_per_s
    variant = (gen.backend_info or {}).get("variant") if gen.backend == "native" else None
    on = f"{gen.backend} ({variant})" if variant else gen.backend
    print(f"\n[{gen.mode}, {gen.precision} on {on}, prefill {gen.prefill_precision}] prompt {len(ids)} tokens, "
          f"{len(gen.tokens)} new{' (stop id)' if gen.stopped else ''}; TTFT {gen.ttft_ms:.1f} ms, decode {tps:.1f} tokens/s, "
          f"mean accepted {gen.mean_accepted:.2f} per step", file=sys.stderr)
    if args.json:
        report = {"tokens": gen.tokens, "ttft_ms": round(gen.ttft_ms, 3),
                  "decode_tokens_per_s": None if math.isnan(tps) else round(tps, 3),
                  "mean_accepted": round(gen.mean_accepted, 4), "stopped": gen.stopped, "mode": gen.mode,
                  "precision": gen.precision, "prefill_precision": gen.prefill_precision, "backend": gen.backend,
                  "backend_info": gen.backend_info, "prompt_tokens": len(ids)}
        Path(args.json).write_text(json.dumps(report) + "\n")
    return 0
