"""Every kernel variant of the native pass computes generic C's numbers (sol_control/native/).

Generic C (kernels_generic.c) is the reference. Each variant this CPU runs goes through both graph
families (the shipped static-int8 policies with plain heads, a tiny static graph whose outputs are
not a multiple of 16, an imported LM's int4 graph with chained heads) and must give the same
logits, top probabilities, accepted counts and heads' guesses, bit for bit. The NEON variant is
cross-compiled and run under qemu-aarch64 on a dump of the packed weights and the same calls.
A variant the CPU lacks is refused, naming the missing flags."""
from __future__ import annotations

import ctypes
import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from sol_control.decoding import greedy, speculate_heads
from sol_control.decoding import native
from sol_control.decoding.native import NativeDecoderSession, NativeModel
from sol_control.native import build, isa
from tests.test_native import MODELS, built, lm, tiny_static  # noqa: F401 (fixtures)

RUNNABLE = [v for v in isa.runnable() if v != "generic"]
CROSS_CC, QEMU = "aarch64-linux-gnu-gcc", "qemu-aarch64"


def _calls(vocab: int, capacity: int, seed: int) -> list[tuple[np.ndarray, int, int, int]]:
    """A session's calls: (ids, L, rows, heads_on): a prefill, verify passes of 5 and 3 rows, one token.
    The prefill spans tiles of keys (16 positions each) where the graph's capacity allows."""
    rng = np.random.default_rng(seed)
    n = min(37, capacity - 10)
    lengths = [(n, 1, 1), (5, 5, 1), (3, 3, 2), (1, 1, 1)]
    calls, L = [], 0
    for T, rows, heads in lengths:
        calls.append((rng.integers(0, vocab, T).astype(np.int64), L, rows, heads))
        L += T
    return calls


def _run(model: NativeModel, variant: str, calls) -> list[np.ndarray]:
    """sol_run on fresh buffers with `variant`'s kernels: each call's outputs, flattened."""
    lib, m = native.library(), model.struct
    m.kernels = native.kernels(variant)
    kv = np.zeros(2 * m.n_layers * m.kv_heads * m.capacity * m.head_dim, np.float32)
    keys_t = np.zeros(lib.sol_keys_t_floats(ctypes.byref(m)), np.float32)
    scratch = np.zeros(lib.sol_scratch_floats(ctypes.byref(m), m.capacity), np.float32)
    out = []
    for ids, L, rows, heads_on in calls:
        logits, probs = np.zeros(rows * m.vocab, np.float32), np.zeros(rows, np.float32)
        accepted, head_ids = np.zeros(2, np.int64), np.zeros(max(m.n_draft, 1), np.int64)
        ptr = lambda a: ctypes.c_void_p(a.ctypes.data)  # noqa: E731
        assert lib.sol_run(ctypes.byref(m), ptr(ids), len(ids), L, rows, heads_on, ptr(kv), ptr(keys_t),
                           ptr(logits), ptr(probs), ptr(accepted), ptr(head_ids), ptr(scratch)) == 0
        out.append(np.concatenate([logits.view(np.uint32), probs.view(np.uint32), accepted.view(np.uint32),
                                   head_ids[:m.n_draft].view(np.uint32)]))
    return out


def _graph(which: str, tiny_static, lm) -> Path:
    if which == "tiny":
        return tiny_static
    if which == "lm_int4":
        return lm.decoder_path("target", "int4", "fused")
    return MODELS / which / "target_fused_int8.onnx"


GRAPHS = ["grasp", "qc", "tiny", "lm_int4"]


@pytest.mark.parametrize("which", GRAPHS)
def test_every_variant_this_cpu_runs_equals_generic_c_bit_for_bit(which, tiny_static, lm):
    path = _graph(which, tiny_static, lm)
    model = NativeModel.from_onnx(path)
    calls = _calls(model.struct.vocab, model.struct.capacity, seed=len(which))
    reference = _run(model, "generic", calls)
    assert RUNNABLE, f"this CPU ({isa.cpu_model()}) runs no variant but generic C"
    for variant in RUNNABLE:
        got = _run(model, variant, calls)
        for i, (a, b) in enumerate(zip(got, reference)):
            assert np.array_equal(a, b), f"{which}: {variant} parts from generic C at call {i}"


def test_saturated_static_activations_stay_exact(tiny_static):
    """Inputs far past their calibrated |max| saturate at u8 255: AVX2's vpmaddubsw would saturate
    its pair sums there, so those rows take the split path; every variant still equals generic C."""
    model = NativeModel.from_onnx(tiny_static)
    for i in range(model.struct.n_layers):
        for name in ("qkv", "o", "gate_up", "down"):
            getattr(model.struct.layers[i], name).step /= 8  # 8x finer steps: most inputs past 255
    calls = _calls(model.struct.vocab, model.struct.capacity, seed=11)
    reference = _run(model, "generic", calls)
    for variant in RUNNABLE:
        assert all(np.array_equal(a, b) for a, b in zip(_run(model, variant, calls), reference)), variant


@pytest.mark.parametrize("task", ["grasp", "qc"])
def test_greedy_and_speculative_answers_are_the_same_in_every_variant(task):
    path = MODELS / task / "target_fused_int8.onnx"
    rng = np.random.default_rng(4)
    prefixes = [rng.integers(0, 100, int(rng.integers(6, 20))) for _ in range(4)]
    answers = {}
    for variant in ["generic", *RUNNABLE]:
        sess = NativeDecoderSession(path, variant=variant)
        plain = [greedy(sess, p % sess.vocab, 10).tokens for p in prefixes]
        assert [speculate_heads(sess, p % sess.vocab, 10).tokens for p in prefixes] == plain, variant
        answers[variant] = plain
    assert all(a == answers["generic"] for a in answers.values())


def test_a_variant_the_cpu_lacks_is_refused_naming_its_flags(monkeypatch):
    path = MODELS / "qc" / "target_fused_int8.onnx"
    other = "avx2" if isa.arch() == "aarch64" else "neon"
    with pytest.raises(ValueError, match="not a variant"):
        NativeDecoderSession(path, variant=other)
    monkeypatch.setattr(isa, "cpu_flags", lambda: {"sse2", "avx"})
    monkeypatch.setenv(isa.ENV, "avx2")
    with pytest.raises(ValueError, match="lacks avx2, fma"):
        isa.requested()
    if isa.arch() == "x86_64":
        with pytest.raises(ValueError, match="lacks avx2, fma"):
            NativeDecoderSession(path)
    monkeypatch.setenv(isa.ENV, "avx3")
    with pytest.raises(ValueError, match="SOL_CONTROL_ISA must be"):
        isa.requested()


def test_the_cpu_refuses_what_it_cannot_execute():
    """The library's own probe (not /proc/cpuinfo) agrees: every variant it offers runs, and a
    variant whose flags this CPU lacks gives no table."""
    lib = native.library()
    for variant in native.built_variants():
        table = lib.sol_kernels(variant.encode())
        assert bool(table) == (not isa.missing_flags(variant)), variant
    assert native.library_variant() == (isa.requested() or isa.probed())


def test_sol_control_isa_forces_the_variant_of_new_sessions(monkeypatch):
    path = MODELS / "qc" / "target_fused_int8.onnx"
    monkeypatch.setenv(isa.ENV, "generic")
    assert NativeDecoderSession(path).variant == "generic" == native.library_variant()
    monkeypatch.delenv(isa.ENV)
    assert NativeDecoderSession(path).variant == isa.probed()


# ---- NEON: cross-compiled, run under qemu-aarch64 -cpu max ------------------------------------

def _needs_cross():
    missing = [t for t in (CROSS_CC, QEMU) if shutil.which(t) is None]
    if missing:
        message = f"{', '.join(missing)} missing (Debian gcc-aarch64-linux-gnu, qemu-user: `make test` installs them)"
        if os.environ.get("SOL_CONTROL_REQUIRE_CROSS"):
            pytest.fail(message)
        pytest.skip(message)


def _pointers(obj, index: dict[int, int]):
    """Every pointer field of a _Model (nested _Layer and _Linear, arrays of them) replaced by its
    array's index + 1."""
    for name, kind in obj._fields_:
        value = getattr(obj, name)
        if kind is ctypes.c_void_p:
            if name != "kernels":
                assert value is None or value in index, f"{name} points outside the model's arrays"
            setattr(obj, name, 0 if value is None or name == "kernels" else index[value] + 1)
        elif isinstance(value, ctypes.Array):
            for item in value:
                _pointers(item, index)
        elif isinstance(value, ctypes.Structure):
            _pointers(value, index)


def _dump(model: NativeModel, calls, path: Path) -> None:
    arrays = model._arrays
    index = {a.ctypes.data: i for i, a in enumerate(arrays)}
    m = type(model.struct).from_buffer_copy(bytes(model.struct))
    _pointers(m, index)
    with open(path, "wb") as f:
        f.write(b"SOLDUMP1" + struct.pack("<I", len(arrays)))
        for a in arrays:
            f.write(struct.pack("<Q", a.nbytes) + a.tobytes())
        f.write(bytes(m) + struct.pack("<I", len(calls)))
        for ids, L, rows, heads in calls:
            f.write(struct.pack("<4i", len(ids), L, rows, heads) + ids.astype("<i8").tobytes())


@pytest.fixture(scope="module")
def neon_driver(tmp_path_factory) -> Path:
    _needs_cross()
    work = tmp_path_factory.mktemp("neon")
    objs = build.objects(CROSS_CC, "aarch64", work, ["-Wno-unknown-pragmas"])
    driver = work / "driver"
    here = Path(__file__).resolve().parent / "native" / "driver.c"
    subprocess.run([CROSS_CC, *build.COMMON, "-static", f"-I{build.HERE}", "-o", str(driver), str(here),
                    *map(str, objs), "-lm"], check=True, capture_output=True, text=True)
    return driver


@pytest.mark.process
@pytest.mark.parametrize("which", GRAPHS)
def test_neon_under_qemu_equals_generic_c_here(which, neon_driver, tiny_static, lm, tmp_path):
    """The aarch64 build's generic and NEON (dotprod) kernels, on the same packed weights and calls,
    against this machine's generic C: the same bits (generic C fixes every float operation)."""
    model = NativeModel.from_onnx(_graph(which, tiny_static, lm))
    calls = _calls(model.struct.vocab, model.struct.capacity, seed=len(which))
    reference = np.concatenate(_run(model, "generic", calls))
    _dump(model, calls, tmp_path / "dump")
    done = subprocess.run([QEMU, "-cpu", "max", str(neon_driver), str(tmp_path / "dump"), str(tmp_path / "out"),
                           "generic", "neon"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    for variant in ("generic", "neon"):
        got = np.fromfile(tmp_path / f"out.{variant}", np.uint32)
        assert got.shape == reference.shape and np.array_equal(got, reference), f"aarch64 {variant} parts from x86 generic"
