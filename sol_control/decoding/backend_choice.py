"""`open_decoder`'s "auto" for a fused graph the native pass computes: time both backends, keep the faster.

The rule (`choose`): the native pass runs the graph unless ONNX Runtime is at least MARGIN (10 %)
faster on it. What is timed is what the decoder runs: a one-row step and a verify pass of k + 1
rows (k = the graph's draft heads, else VERIFY_GUESSES) after a short cached prefix, both backends
taking turns, about BUDGET_NS in all, the median per call kind; the sum of the two medians decides.
Where the native pass is kept its prefill is chosen the same way on a prompt-sized chunk
(PREFILL_TOKENS): in C on the graph itself, or on ONNX Runtime (the prefill graph beside it, an
imported LM's int8, else the same graph), whose keys the C pass then takes over.

The answer is remembered per CPU model, native kernel variant and library build, ONNX Runtime
version, graph and prefill graph sha256 and threads, in a JSON file (`cache_path`), so a host
gives the same answers on every run and measures once. A corrupt file is ignored with a warning.

Each session gets `backend_info`: {"backend", "variant", "step_ms", "verify_ms", "prefill",
"prefill_ms" (when measured), "cached", "reason"}; times in ms per call, keyed by backend.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from .fused import _Binding

log = logging.getLogger(__name__)

BACKENDS = ("native", "onnxruntime")
MARGIN = 0.10  # ONNX Runtime must take at least 10 % less time to be picked over the native pass
BUDGET_NS = 50_000_000  # per measurement (step + verify, or prefill), both backends
MAX_ROUNDS = 7  # timed rounds at most (each backend once a round)
PREFIX_TOKENS = 16  # cached positions before a timed step or verify pass
VERIFY_GUESSES = 4  # the guesses of a timed verify pass on a graph without draft heads
PREFILL_TOKENS = 32  # a prompt-sized chunk
CACHE_ENV = "SOL_CONTROL_CACHE_DIR"
CACHE_FILE = "backend_choice.json"
CACHE_VERSION = 1


# ---- the rule -------------------------------------------------------------------------------------

def choose(native_ms: float, onnxruntime_ms: float, margin: float = MARGIN) -> str:
    """"onnxruntime" when its time is at least `margin` below the native pass's, else "native"."""
    return "onnxruntime" if onnxruntime_ms <= (1.0 - margin) * native_ms else "native"


def explain(what: str, native_ms: float, onnxruntime_ms: float) -> str:
    """Why `choose` answered as it did, with the times it compared."""
    pick = choose(native_ms, onnxruntime_ms)
    verdict = ("ONNX Runtime is at least 10 % faster" if pick == "onnxruntime"
               else "ONNX Runtime is not 10 % faster: the native pass is kept")
    return f"{what}: native {native_ms:.3f} ms, ONNX Runtime {onnxruntime_ms:.3f} ms; {verdict}"


# ---- measurement ----------------------------------------------------------------------------------

def time_rounds(runs: dict[str, Callable[[], tuple[int, ...]]], budget_ns: int = BUDGET_NS,
                max_rounds: int = MAX_ROUNDS) -> dict[str, list[float]]:
    """The median ms of each of the ns times that `runs[name]()` returns, the runs taking turns
    (the first one alternating) round after round until `max_rounds` or the budget is spent. The
    first round is a warm-up (first calls bind and allocate), dropped unless it took the budget."""
    assert runs and max_rounds >= 1, (list(runs), max_rounds)
    samples: dict[str, list[tuple[int, ...]]] = {name: [] for name in runs}
    order, start, warm_up = list(runs.items()), time.perf_counter_ns(), True
    while (done := len(samples[order[0][0]])) < max_rounds:
        for name, run in order[::-1] if done % 2 else order:
            samples[name].append(run())
        spent = time.perf_counter_ns() - start
        if warm_up and spent < budget_ns:
            samples = {name: [] for name in runs}
        elif spent >= budget_ns:
            break
        warm_up = False
    return {name: [statistics.median(col) / 1e6 for col in zip(*rows)] for name, rows in samples.items()}


def _step_and_verify(sess, prefix_len: int, ids: np.ndarray) -> Callable[[], tuple[int, int]]:
    """A round on `sess` (its cache holding `prefix_len` ids): ns of a one-row step (ids[0]) and
    of a verify pass of all `ids` [k+1], the cache rewound after each. An untimed step first: in a
    decode loop a call follows calls of the same session (its weights in the CPU's caches), not
    the other backend's."""
    def run() -> tuple[int, int]:
        sess.rewind(prefix_len)
        sess.forward(ids[:1])
        sess.rewind(prefix_len)
        t0 = time.perf_counter_ns()
        sess.forward(ids[:1])
        t1 = time.perf_counter_ns()
        sess.rewind(prefix_len)
        t2 = time.perf_counter_ns()
        sess.forward(ids)
        t3 = time.perf_counter_ns()
        return t1 - t0, t3 - t2
    return run


def measure_decoding(native, onnxruntime) -> dict[str, dict[str, float]]:
    """{"step_ms": {backend: ms}, "verify_ms": {backend: ms}} of the two sessions of one graph."""
    rows = min(native.draft_heads or VERIFY_GUESSES, native.max_rows - 1) + 1
    prefix_len = max(1, min(PREFIX_TOKENS, native.max_context - rows - 1))
    rng = np.random.default_rng(0)
    prefix, ids = rng.integers(0, native.vocab, prefix_len), rng.integers(0, native.vocab, rows)
    runs = {}
    for name, sess in zip(BACKENDS, (native, onnxruntime)):
        sess.reset()
        sess.prefill(prefix)
        runs[name] = _step_and_verify(sess, prefix_len, ids)
    try:
        ms = time_rounds(runs)
    finally:
        native.reset()
        onnxruntime.reset()
    return {"step_ms": {n: round(ms[n][0], 4) for n in BACKENDS},
            "verify_ms": {n: round(ms[n][1], 4) for n in BACKENDS}}


def prefill_binding(native) -> _Binding:
    """The ONNX Runtime binding a native session prefills through: its prefill graph's, else a
    second binding of its own graph's session (NativeDecoderSession._call runs every binding but
    the main one on ONNX Runtime, then takes the keys over)."""
    return native._prefill or _Binding(native.session, native._bind_static)


def route_prefill(native, route: str, binding: _Binding) -> None:
    """Prefill in C (`route` "native": the session's main binding) or on ONNX Runtime (`binding`)."""
    native._prefill = binding if route == "onnxruntime" else None
    binding.calls = 0  # prefill_calls counts the session's prefills, not the measurement's


def measure_prefill(native) -> dict[str, dict[str, float]]:
    """{"prefill_ms": {backend: ms}} of one prompt-sized chunk prefilled in C and on ONNX Runtime."""
    binding = prefill_binding(native)
    ids = np.random.default_rng(1).integers(0, native.vocab, max(1, min(PREFILL_TOKENS, native.max_context - 1,
                                                                         native.max_step_tokens)))

    def run(route: str) -> Callable[[], tuple[int]]:
        def one() -> tuple[int]:
            route_prefill(native, route, binding)
            native.reset()
            t0 = time.perf_counter_ns()
            native.prefill(ids)
            return (time.perf_counter_ns() - t0,)
        return one
    try:
        ms = time_rounds({name: run(name) for name in BACKENDS})
    finally:
        native.reset()
    return {"prefill_ms": {n: round(ms[n][0], 4) for n in BACKENDS}}


# ---- the cache ------------------------------------------------------------------------------------

def cache_path() -> Path:
    """$SOL_CONTROL_CACHE_DIR/backend_choice.json, else ~/.cache/sol_control/backend_choice.json."""
    root = os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sol_control"
    return Path(root) / CACHE_FILE


def library_variant() -> str | None:
    """The kernel variant a native session opened now runs, None without the library."""
    from . import native

    return native.library_variant()


@functools.lru_cache(maxsize=8)
def _digest(path: str, mtime_ns: int, size: int) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def library_build() -> str:
    """A short digest of the native library file: a rebuilt library is measured anew."""
    from . import native

    try:
        st = native.LIBRARY.stat()
    except OSError:
        return "none"
    return _digest(str(native.LIBRARY), st.st_mtime_ns, st.st_size)


def cache_key(variant: str, graph_sha256: str, prefill_sha256: str | None, threads: int) -> str:
    """What a measured choice holds for: this CPU model, the library (variant, build), ONNX Runtime,
    the graph (and prefill graph) by sha256, threads."""
    import onnxruntime

    from ..native import isa

    return "|".join([isa.cpu_model(), variant, library_build(), f"onnxruntime {onnxruntime.__version__}",
                     graph_sha256, prefill_sha256 or "-", f"threads {threads}"])


def _times_ok(times) -> bool:
    return (isinstance(times, dict) and set(times) == set(BACKENDS)
            and all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in times.values()))


def valid_entry(entry) -> bool:
    """A cache entry as `save_choice` writes it."""
    return (isinstance(entry, dict) and entry.get("backend") in BACKENDS and entry.get("prefill") in BACKENDS
            and isinstance(entry.get("reason"), str) and _times_ok(entry.get("step_ms"))
            and _times_ok(entry.get("verify_ms")) and ("prefill_ms" not in entry or _times_ok(entry["prefill_ms"])))


def read_cache(path: Path | None = None) -> dict[str, dict]:
    """The file's choices by key; {} when it is missing, and with a warning when it is unreadable,
    not ours or corrupt (its invalid entries only are dropped)."""
    path = path or cache_path()
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        log.warning("backend choice cache %s ignored: %s", path, e)
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("choices"), dict):
        log.warning("backend choice cache %s ignored: not a version-%d choice file", path, CACHE_VERSION)
        return {}
    choices = {k: v for k, v in data["choices"].items() if valid_entry(v)}
    if len(choices) != len(data["choices"]):
        log.warning("backend choice cache %s: %d invalid entries ignored", path, len(data["choices"]) - len(choices))
    return choices


def save_choice(key: str, entry: dict, path: Path | None = None) -> None:
    """Add `entry` under `key`, written atomically (a temporary file renamed over the old one); a
    cache that cannot be written costs a warning and a measurement next time, nothing else."""
    path = path or cache_path()
    choices = {**read_cache(path), key: entry}
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
            tmp = f.name
            json.dump({"version": CACHE_VERSION, "choices": choices}, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("backend choice cache %s not written: %s", path, e)
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


# ---- sessions -------------------------------------------------------------------------------------

def info(backend: str, variant: str | None, reason: str, prefill: str | None = None,
         times: dict | None = None, cached: bool = False) -> dict:
    """A session's `backend_info`; `times`: step_ms, verify_ms and (if measured) prefill_ms."""
    times = times or {}
    out = {"backend": backend, "variant": variant, "step_ms": dict(times.get("step_ms", {})),
           "verify_ms": dict(times.get("verify_ms", {})), "prefill": prefill or backend, "cached": cached,
           "reason": reason}
    if "prefill_ms" in times:
        out["prefill_ms"] = dict(times["prefill_ms"])
    return out


def _keep(sess, entry: dict, variant: str, cached: bool):
    sess.backend_info = info(entry["backend"], variant, entry["reason"], entry["prefill"], entry, cached)
    return sess


def open_auto(open_native: Callable, open_onnxruntime: Callable, key: Callable[[str], str],
              choose_prefill: bool = True):
    """The session "auto" gives a graph the native pass may compute: the cached choice for
    `key(variant)`, else both backends measured and the choice cached. `open_native(with_prefill_graph)`
    raises NativeUnsupported where the pass declines (ONNX Runtime then, not cached: the check is
    the graph's). `choose_prefill` False: a native session prefills in C (guessed prefills need it)."""
    from .native import NativeUnsupported

    variant = library_variant()
    if variant is None:
        sess = open_onnxruntime()
        sess.backend_info = info("onnxruntime", None, "no native library (`make native`)")
        return sess
    entry = read_cache().get(key(variant))
    if entry is not None and entry["backend"] == "onnxruntime":
        return _keep(open_onnxruntime(), entry, variant, cached=True)
    try:  # a cached C prefill leaves the prefill graph unopened
        native = open_native(entry is None or entry["prefill"] == "onnxruntime")
    except NativeUnsupported as e:
        sess = open_onnxruntime()
        sess.backend_info = info("onnxruntime", variant, f"the native pass declines this graph: {e}")
        return sess
    if entry is not None:
        if entry["prefill"] == "onnxruntime":
            route_prefill(native, "onnxruntime", prefill_binding(native))
        return _keep(native, entry, variant, cached=True)
    return _measure(native, open_onnxruntime, key(variant), variant, choose_prefill)


def _measure(native, open_onnxruntime: Callable, key: str, variant: str, choose_prefill: bool):
    """Time both backends (and, where the native pass wins, its prefill), cache the choice, return
    the chosen session."""
    ort_sess = open_onnxruntime()
    times = measure_decoding(native, ort_sess)
    totals = {b: times["step_ms"][b] + times["verify_ms"][b] for b in BACKENDS}
    backend = choose(totals["native"], totals["onnxruntime"])
    why = explain("a step + a verify pass", totals["native"], totals["onnxruntime"])
    prefill = "onnxruntime" if backend == "onnxruntime" or native._prefill is not None else "native"
    if backend == "native" and choose_prefill:
        times.update(measure_prefill(native))
        prefill = choose(times["prefill_ms"]["native"], times["prefill_ms"]["onnxruntime"])
        why += "; " + explain("prefill", times["prefill_ms"]["native"], times["prefill_ms"]["onnxruntime"])
        route_prefill(native, prefill, prefill_binding(native))
    elif prefill == "native":
        why += "; the prefill stays in C (the bundle's answer guesses are checked in the graph's own pass)"
    entry = {"backend": backend, "prefill": prefill, "reason": why, **times}
    save_choice(key, entry)
    return _keep(native if backend == "native" else ort_sess, entry, variant, cached=False)
