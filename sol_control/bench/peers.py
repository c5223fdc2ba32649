"""Peer engines on the same weights and the same token workloads (benchmark only).

Two halves, several venvs:
- `run_all(bundle)` runs in our venv: it builds the workload (the bundle's decision prefixes),
  decodes it with our fp32 target (plain greedy, the "standard" outputs), then runs every peer
  engine in its own venv (`bash tools/setup_peers.sh`) as `python -m sol_control.bench.peers
  worker` and returns one row per engine, mode and precision, with agreement against the standard
  outputs. An engine whose venv is missing is skipped with a note.
- the worker runs inside the engine's venv:
    ort-genai     .venv-peers  ONNX Runtime GenAI, plain and speculative (fp32, its own int4)
    transformers  .venv-peers  Hugging Face transformers, plain and assisted generation (fp32)
    openvino      .venv-ov     OpenVINO GenAI, plain and speculative (fp32, its own int8/int4)
    llama.cpp     .venv-llama  llama-cpp-python, plain and draft-model speculative (F32, Q8_0, Q4_0)
  The peer libraries (and, through them, torch) are imported inside the runner functions only, so
  importing this module in the runtime venv never pulls them in.

Weights: Hugging Face folders rebuilt from the bundle's own fp32 ONNX files by
`tools/onnx_to_hf.py` (bit-identical tensors, cached under `.work/peers/hf/`), so every engine
runs exactly the weights we ship; each row says so (`weights_from`).

Every peer decodes exactly `new_tokens` tokens, greedy, with the same thread count as ours. Peers
stop on EOS/pad by default; we disable that (transformers, OpenVINO `ignore_eos`, llama.cpp by
taking tokens from its generator ourselves) or resume after the stop token (ORT GenAI), since our
decisions are fixed-length.

    python -m sol_control.bench.peers --bundle models/grasp [--quick] [--json peers.json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import hashlib
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .common import REPO, pct, table

PEERS_VENV = REPO / ".venv-peers"
OV_VENV = REPO / ".venv-ov"
LLAMA_VENV = REPO / ".venv-llama"
ENGINES = ("ort-genai", "transformers", "openvino", "llama.cpp")
# engine -> (venv, `tools/setup_peers.sh` target that makes it)
VENVS = {"ort-genai": (PEERS_VENV, "genai"), "transformers": (PEERS_VENV, "genai"),
         "openvino": (OV_VENV, "ov"), "llama.cpp": (LLAMA_VENV, "llama")}
# precisions each engine runs by default; "int8"/"int4" are the engine's own weight quantization
PRECISIONS = {"ort-genai": ("fp32", "int4"), "transformers": ("fp32",),
              "openvino": ("fp32", "int8", "int4"), "llama.cpp": ("fp32", "int8", "int4")}
WEIGHTS_FROM = "bundle fp32 ONNX"


@dataclass
class Workload:
    prefixes: list[list[int]]
    new_tokens: int
    rounds: int = 5
    threads: int = 1
    k: int = 8  # draft tokens per speculative step (fixed, the peers' usual knob)


# ---- timing (shared by every runner) ------------------------------------------------------------

# decide(prefix) -> (new tokens, ttft_ms, extra info)
Decide = Callable[[list[int]], tuple[list[int], float, dict]]


def time_decisions(decide: Decide, w: Workload) -> dict:
    """Run every prefix `w.rounds` times; per round tokens/s over all decisions, medians over rounds."""
    decide(w.prefixes[0])  # warm-up: first calls allocate
    tok_s, decode_tok_s, decision_ms, ttft_ms, outputs, infos = [], [], [], [], [], []
    for rnd in range(w.rounds):
        wall = decode = 0.0
        for prefix in w.prefixes:
            t0 = time.perf_counter()
            tokens, ttft, info = decide(prefix)
            ms = (time.perf_counter() - t0) * 1e3
            wall, decode = wall + ms, decode + ms - ttft
            decision_ms.append(ms)
            ttft_ms.append(ttft)
            infos.append(info)
            if rnd == 0:
                outputs.append([int(t) for t in tokens])
        n = len(w.prefixes)
        tok_s.append(n * w.new_tokens / wall * 1e3)
        decode_tok_s.append(n * (w.new_tokens - 1) / decode * 1e3 if decode > 0 else float("nan"))
    accepted = [i["acceptance"] for i in infos if i.get("acceptance") is not None]
    return {
        "tokens_per_s": pct(tok_s, 50), "tokens_per_s_min": min(tok_s), "tokens_per_s_max": max(tok_s),
        "decode_tokens_per_s": pct(decode_tok_s, 50),
        "decision_ms_p50": pct(decision_ms, 50), "ttft_ms_p50": pct(ttft_ms, 50),
        "acceptance": float(np.mean(accepted)) if accepted else None,
        "resumed_after_stop": int(sum(i.get("resumed", 0) for i in infos[:len(w.prefixes)])),
        "outputs": outputs,
    }


# ---- ONNX Runtime GenAI -------------------------------------------------------------------------

def add_word_tokenizer(hf_dir: Path, vocab_size: int) -> None:
    """The GenAI builder insists on a tokenizer; token-id workloads never use it."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(hf_dir)


def genai_convert(hf_dir: Path, out_dir: Path, precision: str, threads: int) -> Path:
    """`onnxruntime_genai.models.builder` HF folder -> GenAI folder (fp32 or its own int4)."""
    if not (out_dir / "genai_config.json").is_file():
        src = out_dir.parent / f"{out_dir.name}-hf"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(hf_dir, src)
        if not (src / "tokenizer.json").is_file():
            add_word_tokenizer(src, json.loads((src / "config.json").read_text())["vocab_size"])
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(src), "-o", str(out_dir),
               "-p", precision, "-e", "cpu"]
        if precision == "int4":
            cmd += ["--extra_options", "int4_accuracy_level=4", "int4_block_size=32"]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    config = json.loads((out_dir / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"].update(intra_op_num_threads=threads, inter_op_num_threads=1)
    (out_dir / "genai_config.json").write_text(json.dumps(config, indent=1))
    return out_dir


def genai_speculative_folder(target: Path, draft: Path, out_dir: Path, k: int) -> Path:
    """Composite GenAI model: target decoder + `model.draft` decoder + `speculative` options. GenAI
    refuses paths with `..`, so target and draft are symlinked inside the folder."""
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    (out_dir / "target").symlink_to(target.resolve())
    (out_dir / "draft").symlink_to(draft.resolve())
    config = json.loads((target / "genai_config.json").read_text())
    draft_decoder = json.loads((draft / "genai_config.json").read_text())["model"]["decoder"]
    config["model"]["decoder"]["filename"] = "target/" + config["model"]["decoder"]["filename"]
    config["model"]["draft"] = {**draft_decoder, "filename": "draft/" + draft_decoder["filename"]}
    config["speculative"] = {"max_draft_tokens": k}
    (out_dir / "genai_config.json").write_text(json.dumps(config, indent=1))
    return out_dir


def genai_decide(model_dir: Path, new_tokens: int) -> Decide:
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))

    def decide(prefix: list[int]):
        t0 = time.perf_counter()
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prefix) + new_tokens, do_sample=False)
        gen = og.Generator(model, params)
        gen.append_tokens(np.asarray(prefix, np.int32))
        ttft_ms, resumed = None, 0
        while gen.token_count() < len(prefix) + new_tokens:
            if gen.is_done():  # stopped on EOS/pad: our decisions are fixed-length, so go on
                gen.append_tokens(np.asarray(gen.get_next_tokens()[:1], np.int32))
                resumed += 1
            else:
                gen.generate_next_token()
            if ttft_ms is None:
                ttft_ms = (time.perf_counter() - t0) * 1e3
        tokens = list(gen.get_sequence(0))[len(prefix):]
        info = {"resumed": resumed}
        stats = gen.get_speculative_stats() if hasattr(gen, "get_speculative_stats") else None
        if stats and stats.get("draft_tokens_evaluated"):
            info["acceptance"] = stats["draft_tokens_accepted"] / stats["draft_tokens_evaluated"]
        return tokens, ttft_ms or 0.0, info

    return decide


def run_genai(hf_target: Path, hf_draft: Path | None, w: Workload, work: Path,
              precisions=("fp32", "int4")) -> list[dict]:
    rows = []
    draft = genai_convert(hf_draft, work / "genai-draft-fp32", "fp32", w.threads) if hf_draft else None
    for prec in precisions:
        target = genai_convert(hf_target, work / f"genai-target-{prec}", prec, w.threads)
        rows.append({"engine": "ort-genai", "mode": "plain", "precision": prec,
                     **time_decisions(genai_decide(target, w.new_tokens), w)})
        if draft is not None:
            spec = genai_speculative_folder(target, draft, work / f"genai-spec-{prec}", w.k)
            rows.append({"engine": "ort-genai", "mode": f"speculative k={w.k}", "precision": prec,
                         **time_decisions(genai_decide(spec, w.new_tokens), w)})
    return rows


# ---- Hugging Face transformers ------------------------------------------------------------------

def transformers_decide(model, new_tokens: int, assistant=None) -> Decide:
    import torch
    from transformers import GenerationConfig
    from transformers.generation.streamers import BaseStreamer

    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=0, do_sample=False,
                              eos_token_id=None, pad_token_id=0, num_beams=1)

    class FirstToken(BaseStreamer):  # generate() calls put() with the prompt, then new tokens
        def __init__(self):
            self.calls, self.first_s = 0, None

        def put(self, value):
            self.calls += 1
            if self.calls == 2:
                self.first_s = time.perf_counter()

        def end(self):
            pass

    def decide(prefix: list[int]):
        ids = torch.tensor([prefix], dtype=torch.long)
        streamer = FirstToken()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                                 assistant_model=assistant, streamer=streamer)
        ttft_ms = ((streamer.first_s or time.perf_counter()) - t0) * 1e3
        return out[0, len(prefix):].tolist(), ttft_ms, {}

    return decide


def run_transformers(hf_target: Path, hf_draft: Path | None, w: Workload) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(w.threads)
    target = AutoModelForCausalLM.from_pretrained(hf_target, dtype=torch.float32).eval()
    target.generation_config.eos_token_id = None  # fixed-length decisions, like ours
    rows = [{"engine": "transformers", "mode": "plain", "precision": "fp32",
             **time_decisions(transformers_decide(target, w.new_tokens), w)}]
    if hf_draft:
        draft = AutoModelForCausalLM.from_pretrained(hf_draft, dtype=torch.float32).eval()
        draft.generation_config.eos_token_id = None
        draft.generation_config.num_assistant_tokens = w.k
        draft.generation_config.num_assistant_tokens_schedule = "constant"
        draft.generation_config.assistant_confidence_threshold = 0.0
        rows.append({"engine": "transformers", "mode": f"assisted k={w.k}", "precision": "fp32",
                     **time_decisions(transformers_decide(target, w.new_tokens, draft), w)})
    return rows


# ---- OpenVINO GenAI ----------------------------------------------------------------------------

# optimum-cli --weight-format and the extra options for each precision. int4 uses groups of 32 on
# every MatMul (ratio 1.0), the layout of our own int4 and of ORT GenAI's.
OV_FORMATS = {"fp32": ["--weight-format", "fp32"], "int8": ["--weight-format", "int8"],
              "int4": ["--weight-format", "int4", "--group-size", "32", "--ratio", "1.0"]}


def ov_export(hf_dir: Path, out_dir: Path, precision: str) -> Path:
    """`optimum-cli export openvino` HF folder -> OpenVINO IR folder (fp32, or NNCF int8/int4)."""
    if not (out_dir / "openvino_model.xml").is_file():
        src = out_dir.parent / f"{out_dir.name}-hf"
        shutil.rmtree(src, ignore_errors=True)
        shutil.copytree(hf_dir, src)
        if not (src / "tokenizer.json").is_file():  # else the exporter invents a 32k-token one
            add_word_tokenizer(src, json.loads((src / "config.json").read_text())["vocab_size"])
        cli = Path(sys.executable).with_name("optimum-cli")
        tmp = out_dir.with_name(out_dir.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        cmd = [str(cli), "export", "openvino", "--model", str(src), "--task", "text-generation-with-past",
               *OV_FORMATS[precision], str(tmp)]
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"optimum-cli export ({precision}) failed: {proc.stderr[-1500:]}")
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)  # a failed export leaves no half folder that looks finished
    return out_dir


def ov_properties(precision: str, threads: int) -> dict:
    """fp32 rows compute and cache in f32 (OpenVINO's CPU defaults are bf16 compute and a u8 KV
    cache, which would not be the fp32 model); quantized rows keep OpenVINO's own defaults."""
    props = {"INFERENCE_NUM_THREADS": threads, "NUM_STREAMS": 1}
    if precision == "fp32":
        # the paged-attention backend (speculative, and plain by default) reads KEY_/VALUE_CACHE_PRECISION
        props.update(INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32", KEY_CACHE_PRECISION="f32",
                     VALUE_CACHE_PRECISION="f32")
    return props


def ov_decide(pipe, new_tokens: int, k: int | None = None) -> Decide:
    import openvino as ov

    config = pipe.get_generation_config()
    # ignore_eos alone: it goes on past EOS and keeps EOS a candidate; min_new_tokens would mask
    # EOS out of the logits instead, and greedy would pick another token than ours
    config.max_new_tokens, config.min_new_tokens = new_tokens, 0
    config.ignore_eos, config.do_sample = True, False
    if k:
        config.num_assistant_tokens = k

    def decide(prefix: list[int]):
        res = pipe.generate(ov.Tensor(np.asarray([prefix], np.int64)), config)
        tokens = list(res.tokens[0])
        if len(tokens) != new_tokens:
            raise RuntimeError(f"OpenVINO returned {len(tokens)} tokens, asked for {new_tokens}")
        info = {}
        extended = getattr(res, "extended_perf_metrics", None)
        if k and extended is not None and hasattr(extended, "get_num_accepted_tokens"):
            drafted = extended.get_num_draft_tokens()
            if drafted:
                info["acceptance"] = extended.get_num_accepted_tokens() / drafted
        return tokens, float(res.perf_metrics.get_ttft().mean), info

    return decide


def run_openvino(hf_target: Path, hf_draft: Path | None, w: Workload, work: Path,
                 precisions=PRECISIONS["openvino"]) -> list[dict]:
    import openvino_genai as og

    rows = []
    draft = ov_export(hf_draft, work / "ov-draft-fp32", "fp32") if hf_draft else None
    for prec in precisions:
        target = ov_export(hf_target, work / f"ov-target-{prec}", prec)
        props = ov_properties(prec, w.threads)
        pipe = og.LLMPipeline(str(target), "CPU", **props)
        rows.append({"engine": "openvino", "mode": "plain", "precision": prec,
                     **time_decisions(ov_decide(pipe, w.new_tokens), w)})
        del pipe
        if draft is not None:
            # the draft stays fp32 (with fp32 properties) whatever the target's precision, as ours
            spec = og.LLMPipeline(str(target), "CPU", draft_model=og.draft_model(str(draft), "CPU",
                                  **ov_properties("fp32", w.threads)), **props)
            rows.append({"engine": "openvino", "mode": f"speculative k={w.k}", "precision": prec,
                         **time_decisions(ov_decide(spec, w.new_tokens, w.k), w)})
            del spec
    return rows


# ---- llama.cpp (llama-cpp-python) ----------------------------------------------------------------

LLAMA_FTYPES = {"int8": "LLAMA_FTYPE_MOSTLY_Q8_0", "int4": "LLAMA_FTYPE_MOSTLY_Q4_0"}


def llama_converter() -> Path:
    """convert_hf_to_gguf.py from the llama-cpp-python source package (`tools/setup_peers.sh llama`
    unpacks it into the venv; the wheel does not ship it)."""
    path = Path(sys.prefix) / "llama-cpp-src" / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py"
    if not path.is_file():
        raise RuntimeError(f"no GGUF converter at {path}: run `bash tools/setup_peers.sh llama`")
    return path


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
    """HF folder -> GGUF: F32 with llama.cpp's converter, then Q8_0/Q4_0 with its own quantizer."""
    import ctypes

    import llama_cpp

    out_dir.mkdir(parents=True, exist_ok=True)
    f32 = out_dir / "model-f32.gguf"
    if not f32.is_file():
        tmp = f32.with_suffix(".tmp")
        cmd = [sys.executable, "-c", _CONVERT, str(llama_converter()), str(hf_dir), "--outtype", "f32",
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


def llama_open(path: Path, precision: str, w: Workload, draft_model=None):
    """fp32 rows keep the KV cache in f32 (llama.cpp's default is f16, not the fp32 model);
    quantized rows keep llama.cpp's defaults."""
    import llama_cpp

    n_ctx = max(len(p) for p in w.prefixes) + w.new_tokens + w.k + 1
    n_ctx = -(-n_ctx // 64) * 64
    kv = {"type_k": llama_cpp.GGML_TYPE_F32, "type_v": llama_cpp.GGML_TYPE_F32} if precision == "fp32" else {}
    return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=w.threads,
                           n_threads_batch=w.threads, draft_model=draft_model, verbose=False, **kv)


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


def llama_decide(llm, new_tokens: int, draft=None) -> Decide:
    """llama-cpp-python's own `generate()` loop (the one path that drives `draft_model`), greedy
    (temp 0), for plain and speculative alike. It never stops by itself: EOS handling lives in its
    completion API, so taking exactly `new_tokens` tokens gives fixed-length decisions."""
    def decide(prefix: list[int]):
        llm.reset()
        if draft is not None:
            draft.reset()
        tokens, ttft_ms = [], None
        t0 = time.perf_counter()
        for token in llm.generate(prefix, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                                  reset=True):
            if ttft_ms is None:
                ttft_ms = (time.perf_counter() - t0) * 1e3
            tokens.append(int(token))
            if len(tokens) == new_tokens:
                break
        info = {}
        if draft is not None:
            info["acceptance"] = draft.acceptance(len(prefix), tokens)
        return tokens, ttft_ms or 0.0, info

    return decide


def run_llama(hf_target: Path, hf_draft: Path | None, w: Workload, work: Path,
              precisions=PRECISIONS["llama.cpp"]) -> list[dict]:
    rows = []
    draft_gguf = gguf_convert(hf_draft, work / "gguf-draft", "fp32", w.threads) if hf_draft else None
    for prec in precisions:
        target = gguf_convert(hf_target, work / "gguf-target", prec, w.threads)
        label = {"fp32": "fp32", "int8": "int8 (Q8_0)", "int4": "int4 (Q4_0)"}[prec]
        llm = llama_open(target, prec, w)
        rows.append({"engine": "llama.cpp", "mode": "plain", "precision": label,
                     **time_decisions(llama_decide(llm, w.new_tokens), w)})
        llm.close()
        if draft_gguf is not None:
            draft = llama_draft_model(llama_open(draft_gguf, "fp32", w), w.k)
            llm = llama_open(target, prec, w, draft_model=draft)
            rows.append({"engine": "llama.cpp", "mode": f"speculative k={w.k}", "precision": label,
                         **time_decisions(llama_decide(llm, w.new_tokens, draft), w)})
            llm.close()
    return rows


# ---- worker (peers venv) and orchestration (our venv) -------------------------------------------

def worker(spec_path: Path, out_path: Path) -> None:
    spec = json.loads(spec_path.read_text())
    w = Workload(**spec["workload"])
    hf_target, hf_draft = Path(spec["hf_target"]), spec.get("hf_draft") and Path(spec["hf_draft"])
    engine, work = spec["engine"], Path(spec["work"])
    precisions = tuple(spec.get("precisions") or PRECISIONS.get(engine, ("fp32",)))
    if engine == "ort-genai":
        rows = run_genai(hf_target, hf_draft, w, work, precisions)
    elif engine == "transformers":
        rows = run_transformers(hf_target, hf_draft, w)
    elif engine == "openvino":
        rows = run_openvino(hf_target, hf_draft, w, work, precisions)
    elif engine == "llama.cpp":
        rows = run_llama(hf_target, hf_draft, w, work, precisions)
    else:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    out_path.write_text(json.dumps({"rows": rows}))


def venv_python(engine: str) -> Path:
    return VENVS[engine][0] / "bin" / "python"


def run_peer(engine: str, hf_target: Path, hf_draft: Path | None, w: Workload, work: Path,
             python: Path | None = None, precisions=None, timeout_s: float = 3600) -> list[dict]:
    """Run one engine's worker in its venv (`python`, default the engine's own); its rows (with outputs)."""
    work.mkdir(parents=True, exist_ok=True)
    python = Path(python or venv_python(engine))
    wanted = PRECISIONS.get(engine, ("fp32",))
    precisions = [p for p in (precisions or wanted) if p in wanted]
    spec = {"engine": engine, "hf_target": str(hf_target), "hf_draft": str(hf_draft) if hf_draft else None,
            "workload": asdict(w), "work": str(work), "precisions": precisions}
    spec_path, out_path = work / f"{engine}-spec.json", work / f"{engine}-rows.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(w.threads)}
    proc = subprocess.run([str(python), "-m", "sol_control.bench.peers", "worker", str(spec_path), str(out_path)],
                          env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"peer {engine} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(out_path.read_text())["rows"]


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> dict:
    same = [a == b for a, b in zip(outputs, reference)]
    tokens = [x == y for a, b in zip(outputs, reference) for x, y in zip(a, b)]
    return {"match_standard": float(np.mean(same)) if same else 0.0,
            "token_agreement": float(np.mean(tokens)) if tokens else 0.0}


def hf_folders(bundle, cache: Path | None = None) -> tuple[Path, Path | None]:
    """HF folders holding exactly the bundle's weights: rebuilt from its fp32 ONNX files by
    `tools/onnx_to_hf.py` (onnx + numpy, no torch) and cached under
    `.work/peers/hf/<bundle name>-<sha256 prefix of those files>/{target,draft}`.

    Always from the bundle, never from `.work/<task>/` (what `make models` trains): that folder
    can hold other weights than the shipped ones (it did for the qc draft, retrained later), and a
    fresh clone does not have it."""
    import importlib.util

    m = bundle.manifest
    roles = {"target": m.target} | ({"draft": m.draft} if m.draft is not None and "fp32" in m.draft.files else {})
    digest = hashlib.sha256("".join(m.files[spec.files["fp32"]].sha256 for spec in roles.values()).encode())
    folder = Path(cache or REPO / ".work" / "peers" / "hf") / f"{m.name}-{digest.hexdigest()[:12]}"
    if not all((folder / role / "config.json").is_file() for role in roles):
        for spec in roles.values():
            bundle.path(spec.files["fp32"])  # sha256 checked
        spec = importlib.util.spec_from_file_location("onnx_to_hf", REPO / "tools" / "onnx_to_hf.py")
        onnx_to_hf = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(onnx_to_hf)
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        onnx_to_hf.convert_bundle(bundle.root, tmp)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)  # whole or not at all
    return folder / "target", (folder / "draft" if "draft" in roles else None)


def weights_digest(*folders: Path | None) -> str:
    """Short sha256 over the weight files: converted peer models are cached under it."""
    from ..bundle import sha256_file  # here, not at the top: workers run in venvs without pydantic

    h = hashlib.sha256()
    for folder in folders:
        for f in sorted(folder.glob("*.safetensors")) if folder else ():
            h.update(sha256_file(f).encode())
    return h.hexdigest()[:12]


def standard_outputs(bundle, prefixes: list[list[int]], new_tokens: int, threads: int) -> list[list[int]]:
    from ..decoding import greedy, open_decoder

    target = open_decoder(bundle, "target", "fp32", threads)
    return [greedy(target, np.asarray(p, np.int64), new_tokens).tokens for p in prefixes]


def run_all(bundle, quick: bool = False, engines=ENGINES, python: Path | None = None,
            hf_target: Path | None = None, hf_draft: Path | None = None, threads: int = 1,
            k: int = 8, work: Path | None = None, precisions=None) -> dict:
    """Rows for every peer engine, mode and precision on the bundle's decision workload (see the
    module doc). `python` forces one interpreter for every engine (default: each engine's venv);
    `precisions` narrows every engine to these (default: each engine's own list)."""
    from . import decode_bench

    available = [e for e in engines if Path(python or venv_python(e)).exists()]
    skipped = {e: f"no venv at {VENVS[e][0]}: run `bash tools/setup_peers.sh {VENVS[e][1]}`"
               for e in engines if e not in available}
    if not available:
        return {"note": "no peer venv: run `bash tools/setup_peers.sh`", "rows": [], "skipped": skipped}
    weights_from = WEIGHTS_FROM
    if hf_target is None:
        hf_target, default_draft = hf_folders(bundle, work and Path(work) / "hf")
        hf_draft = hf_draft or default_draft
    else:
        weights_from = f"HF folder {hf_target}"
    if not (hf_target / "config.json").is_file():
        return {"note": f"no HF folder with the bundle's weights at {hf_target}", "rows": [], "skipped": skipped}
    if hf_draft is not None and not (hf_draft / "config.json").is_file():
        hf_draft = None
    m = bundle.manifest
    new_tokens = len(m.actions) or 16
    prefixes = [p.tolist() for p in decode_bench.decision_prefixes(bundle, 4 if quick else 16)]
    w = Workload(prefixes, new_tokens, rounds=2 if quick else 5, threads=threads, k=k)
    reference = standard_outputs(bundle, prefixes, new_tokens, threads)
    work = Path(work or REPO / ".work" / "peers" / f"{m.name}-{weights_digest(hf_target, hf_draft)}")
    rows, errors = [], {}
    for engine in available:
        try:
            for row in run_peer(engine, hf_target, hf_draft, w, work / engine, python, precisions):
                row.update(agreement(row.pop("outputs"), reference), weights_from=weights_from)
                rows.append(row)
        except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
            errors[engine] = str(e)[-1500:]
    return {"rows": rows, "errors": errors, "skipped": skipped, "new_tokens": new_tokens,
            "decisions": len(prefixes), "rounds": w.rounds, "threads": threads, "k": k,
            "weights_from": weights_from, "hf_target": str(hf_target),
            "hf_draft": str(hf_draft) if hf_draft else None}


def print_rows(result: dict) -> None:
    head = ["engine", "mode", "prec", "tok/s", "min-max", "decode tok/s", "ms/decision", "TTFT ms", "accept", "= std"]
    body = [[r["engine"], r["mode"], r["precision"], f"{r['tokens_per_s']:.0f}",
             f"{r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f}", f"{r['decode_tokens_per_s']:.0f}",
             f"{r['decision_ms_p50']:.2f}", f"{r['ttft_ms_p50']:.2f}",
             "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}", f"{r['match_standard']:.0%}"]
            for r in result["rows"]]
    print(table(head, body))
    for engine, note in result.get("skipped", {}).items():
        print(f"{engine}: skipped, {note}")
    for engine, err in result.get("errors", {}).items():
        print(f"{engine}: FAILED {err}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["worker"]:
        worker(Path(argv[1]), Path(argv[2]))
        return 0
    from ..bundle import Bundle

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--engines", nargs="*", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--hf-target", type=Path, default=None)
    ap.add_argument("--hf-draft", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--precisions", nargs="*", default=None, choices=("fp32", "int8", "int4"),
                    help="only these (default: each engine's own list)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    result = run_all(Bundle.load(args.bundle), args.quick, tuple(args.engines), hf_target=args.hf_target,
                     hf_draft=args.hf_draft, threads=args.threads, k=args.k, precisions=args.precisions)
    if result.get("note"):
        print(result["note"])
    if result.get("weights_from"):
        print(f"weights: {result['weights_from']} ({result['hf_target']})")
    print_rows(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if result["rows"] and not result.get("errors") else 1


if __name__ == "__main__":
    sys.exit(main())
