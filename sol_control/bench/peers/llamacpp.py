"""llama.cpp through llama-cpp-python, plain and draft-model speculative (runs inside its own venv, see tools/setup_peers.sh)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .common import PRECISIONS, Decide, LMGenerate, LMWork, Workload, folder_mb, time_decisions, time_lm, timed_row

LLAMA_FTYPES = {"int8": "LLAMA_FTYPE_MOSTLY_Q8_0", "int4": "LLAMA_FTYPE_MOSTLY_Q4_0"}


# The converter wants a real text tokenizer (a BPE needs merges, SentencePiece a tokenizer.model)
# and our token-id vocabulary has none, so its Llama `set_vocab` is replaced by one that writes a
# plain list of vocab_size tokens ("llama"/SentencePiece type: tokens, scores and types only).
# Token ids are all we use; nothing is ever tokenized or detokenized.
_CONVERT = """
import sys
from pathlib import Path
sys.argv = sys.argv[1:]
sys.path.insert(0, str(Path(sys.argv[0]).parent))
import convert_hf_to_gguf
import gguf
from conversion.llama import LlamaModel

def set_vocab(self):
    n, hp, w = self.hparams["vocab_size"], self.hparams, self.gguf_writer
    special = {hp.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")} - {None}
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([f"<t{i}>" for i in range(n)])
    w.add_token_scores([0.0] * n)
    w.add_token_types([gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL for i in range(n)])
    w.add_bos_token_id(hp["bos_token_id"]); w.add_eos_token_id(hp["eos_token_id"])
    w.add_pad_token_id(hp.get("pad_token_id", 0)); w.add_unk_token_id(hp.get("pad_token_id", 0))
    w.add_add_bos_token(False); w.add_add_eos_token(False)

LlamaModel.set_vocab = set_vocab
sys.exit(convert_hf_to_gguf.main())
"""


def gguf_convert(hf_dir: Path, out_dir: Path, precision: str, threads: int) -> Path:
    """HF folder -> GGUF: F32 with llama.cpp's converter (convert_hf_to_gguf.py from the
    llama-cpp-python source package: `tools/setup_peers.sh llama` unpacks it into the venv, the
    wheel does not ship it), then Q8_0/Q4_0 with its own quantizer."""
    import ctypes

    import llama_cpp

    out_dir.mkdir(parents=True, exist_ok=True)
    f32 = out_dir / "model-f32.gguf"
    if not f32.is_file():
        converter = Path(sys.prefix, "llama-cpp-src/vendor/llama.cpp/convert_hf_to_gguf.py")
        if not converter.is_file():
            raise RuntimeError(f"no GGUF converter at {converter}: run tools/setup_peers.sh llama")
        tmp = f32.with_suffix(".tmp")
        cmd = [sys.executable, "-c", _CONVERT, str(converter), str(hf_dir), "--outtype", "f32",
               "--outfile", str(tmp)]
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"convert_hf_to_gguf failed: {proc.stderr[-1500:]}")
        tmp.rename(f32)
    if precision == "fp32":
        return f32
    out = out_dir / f"model-{precision}.gguf"
    if not out.is_file():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, LLAMA_FTYPES[precision])
        params.nthread = threads
        tmp = out.with_suffix(".tmp")
        if llama_cpp.llama_model_quantize(str(f32).encode(), str(tmp).encode(), ctypes.byref(params)) != 0:
            raise RuntimeError(f"llama_model_quantize to {precision} failed")
        tmp.rename(out)
    return out


def no_extra_buffer_types() -> None:
    """ggml's AMX weight buffers crash here: SIGILL at `tilezero` in ggml_backend_amx_mul_mat (the
    CPU reports AMX, llama.cpp built with -march=native compiles it in). `Llama()` has no switch
    for them, so its default model params get `use_extra_bufts = False` (AMX and the CPU repack
    buffers off; Q4_1 and F32 weights have no repacked layout anyway)."""
    import llama_cpp.llama_cpp as lib

    if getattr(lib.llama_model_default_params, "no_extra_bufts", False):
        return
    default = lib.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    params.no_extra_bufts = True
    lib.llama_model_default_params = params


def llama_open(path: Path, precision: str, w: Workload, draft_model=None):
    """fp32 rows keep the KV cache in f32 (llama.cpp's default is f16, not the fp32 model);
    quantized rows keep llama.cpp's defaults."""
    import llama_cpp

    n_ctx = -(-(max(len(p) for p in w.prefixes) + w.new_tokens + w.k + 1) // 64) * 64
    return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=w.threads,
                           n_threads_batch=w.threads, draft_model=draft_model, verbose=False, **kv_types(precision))


def kv_types(precision: str) -> dict:
    """An f32 KV cache for fp32 rows (llama.cpp's default is f16); also turns off the AMX buffers."""
    import llama_cpp

    no_extra_buffer_types()
    return {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if precision == "fp32" else {}


def llama_draft_model(draft, k: int):
    """A `LlamaDraftModel` over a second `Llama`: k greedy tokens per call, keeping the draft's KV
    cache for the part of the context it has already seen. Records its proposals so acceptance
    can be counted afterwards (llama-cpp-python does not report it)."""
    from llama_cpp.llama_speculative import LlamaDraftModel

    class Draft(LlamaDraftModel):
        def __init__(self):
            self.proposals: list[tuple[int, list[int]]] = []  # (position of the first proposal, tokens)

        def reset(self):
            draft.reset()
            self.proposals.clear()

        def __call__(self, input_ids, /, **kwargs):
            ids = [int(t) for t in input_ids]
            seen = draft.input_ids[:draft.n_tokens].tolist()
            common = 0
            while common < min(len(seen), len(ids)) and seen[common] == ids[common]:
                common += 1
            draft.n_tokens = min(common, len(ids) - 1)  # eval() drops the KV cache beyond this
            draft.eval(ids[draft.n_tokens:])
            out = []
            for i in range(k):
                # the context's last logits row: Llama.scores is only filled with logits_all=True
                logits = np.ctypeslib.as_array(draft._ctx.get_logits_ith(-1), shape=(draft.n_vocab(),))
                out.append(int(np.argmax(logits)))
                if i + 1 < k:
                    draft.eval(out[-1:])
            self.proposals.append((len(ids), out))
            return np.asarray(out, np.intc)

        def acceptance(self, prefix_len: int, tokens: list[int]) -> float | None:
            """Accepted / proposed draft tokens inside the decision: greedy verification keeps the
            longest proposed prefix that equals the target's own tokens."""
            proposed = accepted = 0
            end = prefix_len + len(tokens)
            for pos, draft_tokens in self.proposals:
                run = True
                for j, t in enumerate(draft_tokens):
                    if pos + j >= end:
                        break
                    proposed += 1
                    run = run and tokens[pos + j - prefix_len] == t
                    accepted += run
            return accepted / proposed if proposed else None

    return Draft()


def llama_tokens(llm, ids: list[int], max_new_tokens: int, stops=()) -> tuple[list[int], float]:
    """llama-cpp-python's own `generate()` loop (the one path that drives `draft_model`), greedy
    (temp 0): the tokens up to a stop id (kept) or `max_new_tokens`, and ms to the first. It never
    stops by itself: EOS handling lives in its completion API."""
    tokens, first_ms = [], None
    t0 = time.monotonic_ns()
    for token in llm.generate(ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
        if first_ms is None:
            first_ms = (time.monotonic_ns() - t0) / 1e6
        tokens.append(int(token))
        if token in stops or len(tokens) == max_new_tokens:
            break
    return tokens, first_ms or 0.0


def llama_decide(llm, new_tokens: int, draft=None) -> Decide:
    """Plain and speculative alike: exactly `new_tokens` tokens (fixed-length decisions)."""
    def decide(prefix: list[int]):
        llm.reset()
        if draft is not None:
            draft.reset()
        tokens, ttft_ms = llama_tokens(llm, prefix, new_tokens)
        return tokens, ttft_ms, {} if draft is None else {"acceptance": draft.acceptance(len(prefix), tokens)}

    return decide


def run_decisions(hf_target: Path, hf_draft: Path | None, w: Workload, work: Path,
                  precisions=PRECISIONS["llama.cpp"], timer=time_decisions) -> list[dict]:
    rows = []
    draft_gguf = gguf_convert(hf_draft, work / "gguf-draft", "fp32", w.threads) if hf_draft else None
    for prec in precisions:
        target = gguf_convert(hf_target, work / "gguf-target", prec, w.threads)
        label = {"fp32": "fp32", "int8": "int8 (Q8_0)", "int4": "int4 (Q4_0)"}[prec]
        llm = llama_open(target, prec, w)
        rows.append(timed_row("llama.cpp", "plain", label, llama_decide(llm, w.new_tokens), w, timer))
        llm.close()
        if draft_gguf is not None:
            draft = llama_draft_model(llama_open(draft_gguf, "fp32", w), w.k)
            llm = llama_open(target, prec, w, draft_model=draft)
            rows.append(timed_row("llama.cpp", f"speculative k={w.k}", label, llama_decide(llm, w.new_tokens, draft),
                                  w, timer))
            llm.close()
    return rows


# ---- language models (sol_control.bench.peers.lm) -----------------------------------------------

LLAMA_LOOKUP = {"num_pred_tokens": 10, "max_ngram_size": 2}  # LlamaPromptLookupDecoding's defaults
LM_FORMATS = {"int4": "GGUF Q4_1 linears, Q8_0 embedding (the file itself)",
              "int8": "GGUF Q8_0 (convert_hf_to_gguf F32 -> llama_model_quantize)",
              "fp32": "GGUF F32 (convert_hf_to_gguf), f32 KV cache"}


def llama_lm_generate(llm, stop_ids) -> LMGenerate:
    """A prompt resets the context; a loop round passes the whole conversation and `generate` keeps
    the KV cache of the longest prefix it holds (its own prefix match)."""
    stops = set(stop_ids)

    def generate(ids: list[int], max_new_tokens: int, keep: bool):
        if not keep:
            llm.reset()
        return llama_tokens(llm, ids, max_new_tokens, stops)

    return generate


def lm_gguf(src: Path, work: Path, precision: str, threads: int) -> Path:
    """int4: the GGUF itself (`src`); fp32 / int8: converted from the HF folder `src`."""
    return src if precision == "int4" else gguf_convert(src, work / "gguf", precision, threads)


def prepare_lm(src: Path, work: Path, precision: str, threads: int) -> dict:
    path = lm_gguf(src, work, precision, threads)
    info = {"format": LM_FORMATS[precision], "model_mb": folder_mb(path),
            "note": "generate() keeps the KV cache of the conversation's prefix across loop rounds"}
    if precision == "int4":
        info["weights_from"] = "the GGUF itself (llama.cpp's native format)"
    else:
        info["note"] += "; converter vocabulary replaced by placeholder tokens (ids only)"
    return info


def run_lm(src: Path, w: LMWork, work: Path, precision: str, mode: str, timer=time_lm) -> dict:
    import llama_cpp
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    path = lm_gguf(src, work, precision, w.threads)
    lookup = LLAMA_LOOKUP if mode == "lookup" else None
    n_ctx = -(-(max(w.loop_context_max, max(map(len, w.prompts)) + w.prompt_new_tokens) + 32) // 256) * 256
    # a draft model needs every position's logits; llama-cpp-python 0.3.36 turns that on by itself
    # but sizes its logits array from the argument (n_batch rows), so a context past 512 tokens
    # overflows it: logits_all=True given explicitly
    llm = llama_cpp.Llama(str(path), n_ctx=n_ctx, n_threads=w.threads, n_threads_batch=w.threads, verbose=False,
                          draft_model=LlamaPromptLookupDecoding(**lookup) if lookup else None,
                          logits_all=bool(lookup), **kv_types(precision))
    label = "plain" if lookup is None else f"prompt lookup k={lookup['num_pred_tokens']} n={lookup['max_ngram_size']}"
    row = {"mode": label, **timer(llama_lm_generate(llm, w.stop_ids), w)}
    if lookup:
        row["note"] = "a draft model keeps every position's logits (n_ctx x vocab floats: the RSS)"
    llm.close()
    return row
