"""Opening a bundle's decoder: which session class, which backend, which precision.

    open_decoder(bundle, role, precision) ─► the bundle's layout for that decoder:
        "optimum" (decoder-with-past) ─► DecoderSession (ONNX Runtime)
        "fused" ─► backend "auto": both timed on the graph where the native pass computes it
                   (backend_choice.open_auto), else as asked ─► NativeDecoderSession | FusedDecoderSession

Every session it returns is a `decoder.Decoder` and says in `backend_info` which backend runs it and
why. The precision rules (`fast_precision`, `default_prefill`) read the CPU's flags, not a timing,
so the same bundle gives the same answers on one machine.
"""
from __future__ import annotations

import functools

from . import backend_choice as bc
from .decoder import Decoder
from .fused import FusedDecoderSession
from .guesses import AnswerGuesser
from .native import (MAX_RELATIVE_DIFF, NATIVE_PRECISIONS, NativeDecoderSession, NativeUnsupported,
                     backend_choice, library)
from .session import DecoderSession

FASTER_PREFILL = {"int4": "int8"}  # ONNX Runtime's 4-bit kernel is slow on many rows (docs/BENCHMARKS.md)


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags (/proc/cpuinfo, read once), None where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((l for l in f if l.startswith(("flags", "Features"))), None)
    except OSError:
        return None
    return frozenset(line.split(":", 1)[1].split()) if line else None


def int8_prefill_pays(flags: frozenset[str] | None) -> bool:
    """Does the int8 graph prefill faster than the int4 one on a CPU with these flags? Not on x86
    without VNNI, where MLAS's u8 x s8 GEMM multiplies with vpmaddubsw (SmolLM2, a 64-token prefill
    at 1 thread on an AVX2 host: int8 327 ms, int4 230 ms; with AVX-512 VNNI: int8 130 ms, int4
    241 ms). Elsewhere, and where the flags are unknown, yes (not measured otherwise). A rule on the
    CPU, not a timing at open, so that the same bundle gives the same answers on one machine."""
    return flags is None or "avx2" not in flags or bool(flags & {"avx512_vnni", "avx_vnni"})


def default_prefill(bundle, role: str, precision: str, flags: frozenset[str] | None = None) -> str | None:
    """The precision whose graph should prefill for `precision`: int8 for an int4 decoder when the
    bundle has both as fused graphs and the CPU (`flags`, default this one's) runs int8 prefills
    faster (`int8_prefill_pays`; SmolLM2 with VNNI: half the time to first token), else None (its own)."""
    faster = FASTER_PREFILL.get(precision)
    if faster == "int8" and not int8_prefill_pays(cpu_flags() if flags is None else flags):
        return None
    fused = faster and bundle.decoder_layout(role, precision) == bundle.decoder_layout(role, faster) == "fused"
    return faster if fused else None


def reference_precision(spec) -> str:
    """A decoder's default precision: fp32 where it has it, else its first."""
    return "fp32" if "fp32" in spec.precisions else spec.precisions[0]


def fast_precision(bundle, role: str = "target", flags: frozenset[str] | None = None,
                   native: bool | None = None) -> str:
    """The precision that decodes fastest on this CPU (`flags`, default this one's), among the
    bundle's fused graphs: int4 where the native pass runs (`native`, default: its library loads
    and the backend is not "onnxruntime"; SmolLM2 int4 plain 207 tok/s there against int8's 77 on
    ONNX Runtime, 1 thread, docs/LM.md), else int8 where the integer GEMM is fast
    (`int8_prefill_pays`: its wide verify passes cost little more than one row), else int4; fp32
    (or the only precision) when it has neither. Measured on ONNX Runtime with heads + lookup at 1
    thread: AVX-512 VNNI host int8 91.8 vs int4 81.2 tok/s; AVX2 host int4 85.0 vs int8 66.1. A
    rule, not a timing, for the same answers on every run."""
    spec = bundle.manifest.target if role == "target" else bundle.manifest.draft
    native = (library() is not None and backend_choice() != "onnxruntime") if native is None else native
    int8_first = not native and int8_prefill_pays(cpu_flags() if flags is None else flags)
    order = ("int8", "int4") if int8_first else ("int4", "int8")
    fused = [p for p in order if bundle.decoder_layout(role, p) == "fused"]
    return fused[0] if fused else reference_precision(spec)


def open_decoder(bundle, role: str, precision: str, threads: int = 1, name: str = "",
                 max_context: int | None = None, prefill_precision: str | None = None,
                 backend: str | None = None) -> Decoder:
    """A session for one decoder of a verified bundle (sha256 checked before ORT sees the file): a
    FusedDecoderSession when the bundle has the fused graph, else a DecoderSession. Both follow one
    exactness rule for targets: a single new token gives the logits it would get inside a
    multi-token verify pass, else single tokens run as 2-token steps (a draft only proposes).
    `max_context` overrides the manifest's KV length (benchmarks only: rotary positions work at any
    length, but the model never saw sequences past the manifest's `max_context`). `prefill_precision`:
    prefill chunks run through that precision's fused graph on the same cache (FusedDecoderSession's
    prefill graph), e.g. "int8" for an int4 target; both must be fused graphs. `backend` (default
    SOL_CONTROL_BACKEND, else "auto"): "auto" measures a fused graph the native pass computes
    (`decoding.native`: static-int8 policies, an imported LM's int4) on both backends and keeps the
    native pass unless ONNX Runtime is at least 10 % faster, its prefill likewise
    (`decoding.backend_choice`, remembered per host), and runs everything else on ONNX Runtime;
    "native" insists (NativeUnsupported otherwise; SOL_CONTROL_BACKEND=native only where the native pass
    computes the graph, ONNX Runtime elsewhere); "onnxruntime" never uses the native pass. The
    session's `backend_info` says which backend runs it, why, and the times measured."""
    layout = bundle.decoder_layout(role, precision)
    path = bundle.decoder_path(role, precision, layout)
    name = name or f"{role}_{precision}"
    context = max_context or bundle.manifest.max_context
    if prefill_precision not in (None, precision) and (
            layout != "fused" or bundle.decoder_layout(role, prefill_precision) != "fused"):
        raise ValueError(f"bundle {bundle.root}: a {prefill_precision} prefill for the {precision} {role} "
                         "needs both in the fused layout")
    choice = backend_choice(backend)  # "native" from SOL_CONTROL_BACKEND: where the native pass computes it
    if layout == "fused":
        prefill = prefill_precision if prefill_precision != precision else None
        sess = _fused_session(bundle, role, precision, prefill, context, threads, name, choice, backend)
    elif backend == "native":
        raise ValueError(f"{path}: backend 'native' needs a fused graph, this one is {layout!r}")
    else:
        sess = DecoderSession(path, context, threads=threads, name=name,
                              min_step_tokens=1 if role == "draft" else None)
        sess.backend_info = bc.info("onnxruntime", None, f"an {layout}-layout graph runs on ONNX Runtime")
    if sess.vocab != bundle.manifest.vocab.size:
        raise ValueError(f"{path}: logits have {sess.vocab} entries, manifest vocab.size is "
                         f"{bundle.manifest.vocab.size}")
    guesses = bundle.manifest.target.guesses if role == "target" else None
    if guesses is not None:
        sess.guesser = AnswerGuesser.load(bundle.path(guesses), sess.vocab)
    return sess


def _fused_sha256(bundle, role: str, precision: str) -> str:
    """The manifest's sha256 of a fused graph (checked against the file when the bundle loaded it)."""
    spec = bundle.manifest.target if role == "target" else bundle.manifest.draft
    return bundle.manifest.files[spec.fused[precision]].sha256


def _fused_session(bundle, role: str, precision: str, prefill_precision: str | None, context: int, threads: int,
                   name: str, choice: str, asked: str | None):
    """A fused graph's session on the backend `choice` names: "auto" measures where the native pass
    may run the graph (`backend_choice.open_auto`), "native" / "onnxruntime" are taken as they come."""
    path = bundle.decoder_path(role, precision, "fused")
    prefill = bundle.decoder_path(role, prefill_precision, "fused") if prefill_precision else None

    def open_onnxruntime():
        return FusedDecoderSession(path, context, threads=threads, name=name, prefill_path=prefill,
                                   min_step_tokens=1 if role == "draft" else None)  # None: probe

    def open_native(with_prefill_graph: bool = True):
        return _native_session(path, context, threads, name, prefill if with_prefill_graph else None)

    if choice == "auto" and precision in NATIVE_PRECISIONS:
        key = functools.partial(bc.cache_key, graph_sha256=_fused_sha256(bundle, role, precision), threads=threads,
                                prefill_sha256=_fused_sha256(bundle, role, prefill_precision) if prefill else None)
        guessed = role == "target" and bundle.manifest.target.guesses is not None
        return bc.open_auto(open_native, open_onnxruntime, key, choose_prefill=not guessed)
    if choice == "native" and asked != "native":  # SOL_CONTROL_BACKEND=native: where the native pass computes it
        try:
            sess = open_native()
        except NativeUnsupported as e:
            sess = open_onnxruntime()
            sess.backend_info = bc.info("onnxruntime", None, f"SOL_CONTROL_BACKEND=native, but {e}")
            return sess
    else:
        sess = open_native() if choice == "native" else open_onnxruntime()
    sess.backend_info = _unmeasured_info(choice, asked, precision, prefill is not None)
    return sess


def _unmeasured_info(choice: str, asked: str | None, precision: str, prefill_graph: bool) -> dict:
    """`backend_info` of a fused session whose backend was asked for, or that only ONNX Runtime runs."""
    if choice == "auto":
        return bc.info("onnxruntime", None, f"auto: the native pass computes {' and '.join(NATIVE_PRECISIONS)} "
                                            f"graphs, not {precision}")
    why = f"asked for: {f'backend={asked!r}' if asked not in (None, 'auto') else f'SOL_CONTROL_BACKEND={choice}'}"
    if choice == "onnxruntime":
        return bc.info("onnxruntime", None, why)
    return bc.info("native", bc.library_variant(), why, "onnxruntime" if prefill_graph else "native")


def _native_session(path, context: int, threads: int, name: str, prefill):
    """A NativeDecoderSession when the graph and the build allow one and it computes what ONNX
    Runtime computes on this graph (`agrees_with_onnxruntime`), else NativeUnsupported. `threads`:
    its ONNX Runtime sessions' (the prefill graph's) and the C pass's wide linears' (OpenMP; one
    thread calls no OpenMP at all)."""
    sess = NativeDecoderSession(path, context, threads=threads, name=name, prefill_path=prefill)
    diff = sess.agrees_with_onnxruntime()
    if not diff <= MAX_RELATIVE_DIFF:
        raise NativeUnsupported(f"{path}: the native pass parts from ONNX Runtime's (logits {diff:.3g} apart, "
                                f"relative; more than {MAX_RELATIVE_DIFF})")
    return sess
