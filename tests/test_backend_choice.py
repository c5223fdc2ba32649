"""`open_decoder`'s "auto" (sol_control.decoding.backend_choice): both backends timed on the graph,
the native pass kept unless ONNX Runtime is at least 10 % faster, the prefill chosen the same way,
the answer cached per host (corrupt caches ignored), explicit backends taken as asked; the choice
and its times in `backend_info`, /diagnostics, `sol-control bundle` and `generate --json`.

No test asserts a speed: they check that what was chosen is what the rule says of the times
measured, and that the session really runs where `backend_info` says."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest

from sol_control.bundle import Bundle
from sol_control.cli import main
from sol_control.decoding import backend_choice as bc
from sol_control.decoding import greedy, native, open_decoder
from sol_control.decoding.fused import FusedDecoderSession
from sol_control.decoding.native import NativeDecoderSession
from sol_control.native import isa
from tests.conftest import MODELS

KEYS = {"backend", "variant", "step_ms", "verify_ms", "prefill", "cached", "reason"}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    """This test's own cache file (not yet written); no SOL_CONTROL_BACKEND from the caller."""
    monkeypatch.setenv(bc.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv("SOL_CONTROL_BACKEND", raising=False)
    return tmp_path / "cache" / bc.CACHE_FILE


@pytest.fixture
def measured(monkeypatch) -> list[list[str]]:
    """The runs of every measurement (`time_rounds`, the real one, counted)."""
    calls, real = [], bc.time_rounds

    def counted(runs, *args, **kwargs):
        calls.append(sorted(runs))
        return real(runs, *args, **kwargs)
    monkeypatch.setattr(bc, "time_rounds", counted)
    return calls


@pytest.fixture(scope="module")
def grasp() -> Bundle:
    if native.library() is None:
        pytest.skip("the native pass is not built here (`make native`)")
    return Bundle.load(MODELS / "grasp")


def _total(info: dict, backend: str) -> float:
    return info["step_ms"][backend] + info["verify_ms"][backend]


def _entries(path: Path) -> dict:
    return json.loads(path.read_text())["choices"]


# ---- the rule and the timing loop ----------------------------------------------------------------

@pytest.mark.parametrize("native_ms, onnxruntime_ms, want", [
    (10.0, 9.0, "onnxruntime"),  # exactly 10 % faster
    (10.0, 9.01, "native"),  # 9.9 % faster: the native pass stays
    (1.0, 1.0, "native"), (1.0, 3.0, "native"), (6.0, 1.0, "onnxruntime"), (0.2, 0.1, "onnxruntime")])
def test_the_native_pass_is_kept_unless_onnxruntime_is_10_percent_faster(native_ms, onnxruntime_ms, want):
    assert bc.choose(native_ms, onnxruntime_ms) == want
    assert bc.choose(native_ms, onnxruntime_ms, margin=0.0) == ("onnxruntime" if onnxruntime_ms <= native_ms
                                                                  else "native")
    assert ("at least 10 % faster" in bc.explain("x", native_ms, onnxruntime_ms)) == (want == "onnxruntime")


def test_rounds_alternate_drop_the_warm_up_and_give_medians():
    """Each run once a round, the first run alternating; the warm-up round's values are dropped;
    the median of each returned time, in ms."""
    order, values = [], {"a": iter([999e6] + [1e6, 2e6, 3e6, 4e6, 5e6]), "b": iter([999e6] + [7e6] * 5)}

    def run(name):
        def one():
            order.append(name)
            return next(values[name]), 5e5
        return one
    ms = bc.time_rounds({"a": run("a"), "b": run("b")}, budget_ns=10**15, max_rounds=5)
    assert order == ["a", "b"] + ["a", "b", "b", "a"] * 2 + ["a", "b"]
    assert ms == {"a": [3.0, 0.5], "b": [7.0, 0.5]}


def test_a_round_longer_than_the_budget_is_its_own_warm_up():
    ms = bc.time_rounds({"slow": lambda: (int(1e6),)}, budget_ns=0, max_rounds=5)
    assert ms == {"slow": [1.0]}


# ---- a real session -------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", [None, "generic"])
def test_auto_on_grasp_int8_measures_both_and_keeps_the_faster_or_native_within_10_percent(
        grasp, measured, monkeypatch, variant):
    """On the kernels the CPU probe picks, and on the plain C reference (SOL_CONTROL_ISA=generic,
    much slower than ONNX Runtime here: the case `auto` must not lose)."""
    if variant is not None:
        monkeypatch.setenv(isa.ENV, variant)
        assert bc.library_variant() == variant  # generic C runs on every CPU
    sess = open_decoder(grasp, "target", "int8")
    info = sess.backend_info
    assert set(info) == KEYS and len(measured) == 1  # step + verify; grasp's guessed prefills keep C
    for what in ("step_ms", "verify_ms"):
        assert set(info[what]) == {"native", "onnxruntime"}
        assert all(math.isfinite(ms) and ms > 0 for ms in info[what].values()), info
    want = bc.choose(_total(info, "native"), _total(info, "onnxruntime"))
    assert info["backend"] == want and isinstance(sess, NativeDecoderSession) == (want == "native")
    if want == "native":
        assert _total(info, "onnxruntime") > 0.9 * _total(info, "native")
    assert info["variant"] == bc.library_variant() and info["variant"]
    assert info["prefill"] == want and info["cached"] is False and "step + a verify pass" in info["reason"]
    prefix = grasp.reference_prefixes()[0]
    assert greedy(sess, prefix, 15).tokens == greedy(open_decoder(grasp, "target", "int8", backend="onnxruntime"),
                                                     prefix, 15).tokens


def test_the_cache_gives_the_same_choice_without_measuring_again(grasp, measured, cache):
    first = open_decoder(grasp, "target", "int8")
    assert len(measured) == 1 and len(_entries(cache)) == 1
    again = open_decoder(grasp, "target", "int8")
    assert len(measured) == 1, "a cached choice was measured again"
    assert again.backend_info == {**first.backend_info, "cached": True}
    assert type(again) is type(first)
    open_decoder(grasp, "target", "int8", threads=2)  # another key: measured
    assert len(measured) == 2 and len(_entries(cache)) == 2
    # what the file says is what opens: an entry turned to onnxruntime opens ONNX Runtime, unmeasured
    data = json.loads(cache.read_text())
    key = next(k for k in data["choices"] if k.endswith("threads 1"))
    data["choices"][key]["backend"] = "onnxruntime"
    cache.write_text(json.dumps(data))
    forced = open_decoder(grasp, "target", "int8")
    assert type(forced) is FusedDecoderSession and forced.backend_info["backend"] == "onnxruntime"
    assert forced.backend_info["cached"] is True and len(measured) == 2


@pytest.mark.parametrize("content, warning", [
    (b"{not json", "ignored"), (b"\xff\xfe\x00", "ignored"), (b"[1, 2]", "not a version-1"),
    (b'{"version": 1, "choices": {"k": {"backend": "cuda", "prefill": "native"}}}', "invalid entries")])
def test_a_corrupt_cache_is_ignored_with_a_warning(grasp, measured, cache, caplog, content, warning):
    cache.parent.mkdir(parents=True)
    cache.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger=bc.__name__):
        sess = open_decoder(grasp, "target", "int8")
    assert warning in caplog.text and sess.backend_info["cached"] is False and len(measured) == 1
    entries = _entries(cache)  # rewritten whole, with the new choice only
    assert len(entries) == 1 and bc.valid_entry(next(iter(entries.values())))


def test_an_unwritable_cache_costs_a_warning_not_the_session(grasp, measured, tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    monkeypatch.setenv(bc.CACHE_ENV, str(blocker))
    with caplog.at_level(logging.WARNING, logger=bc.__name__):
        sess = open_decoder(grasp, "target", "int8")
    assert "not written" in caplog.text and sess.backend_info["backend"] in ("native", "onnxruntime")
    assert not list(tmp_path.glob(".backend_choice*"))


def test_explicit_backends_are_not_measured(grasp, measured, cache, monkeypatch):
    monkeypatch.setenv("SOL_CONTROL_BACKEND", "onnxruntime")
    ort_sess = open_decoder(grasp, "target", "int8")
    assert type(ort_sess) is FusedDecoderSession
    assert ort_sess.backend_info == {"backend": "onnxruntime", "variant": None, "step_ms": {}, "verify_ms": {},
                                     "prefill": "onnxruntime", "cached": False,
                                     "reason": "asked for: SOL_CONTROL_BACKEND=onnxruntime"}
    nat = open_decoder(grasp, "target", "int8", backend="native")
    assert isinstance(nat, NativeDecoderSession)
    assert nat.backend_info["backend"] == "native" and nat.backend_info["reason"] == "asked for: backend='native'"
    assert nat.backend_info["variant"] == bc.library_variant() and nat.backend_info["prefill"] == "native"
    monkeypatch.delenv("SOL_CONTROL_BACKEND")
    fp32 = open_decoder(grasp, "target", "fp32")
    assert fp32.backend_info["backend"] == "onnxruntime" and "not fp32" in fp32.backend_info["reason"]
    assert open_decoder(grasp, "draft", "fp32").backend_info["reason"].startswith("an optimum-layout graph")
    assert measured == [] and not cache.exists()


# ---- the prefill: an imported LM's int4 graph with its int8 prefill graph --------------------------

@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> Bundle:
    from tests.test_lm_heads import _import_with_heads

    if native.library() is None:
        pytest.skip("the native pass is not built here (`make native`)")
    return Bundle.load(_import_with_heads(tmp_path_factory.mktemp("choice_lm"), chain=True)[2])


def _reopen_with(cache: Path, lm: Bundle, change: dict, **kwargs):
    """The session open_decoder gives when the cached entry of these arguments says `change`."""
    data = json.loads(cache.read_text())
    for entry in data["choices"].values():
        entry.update(change)
    cache.write_text(json.dumps(data))
    sess = open_decoder(lm, "target", "int4", **kwargs)
    assert sess.backend_info["cached"] and sess.backend_info["prefill"] == change["prefill"]
    return sess


def test_the_prefill_is_measured_and_runs_where_it_was_chosen(lm, measured, cache):
    """C pass or the int8 prefill graph on ONNX Runtime: measured, chosen by the rule, and the
    session prefills there (prefill graph calls, and the tokens of an explicit session that
    prefills the same way)."""
    sess = open_decoder(lm, "target", "int4", prefill_precision="int8")
    info = sess.backend_info
    if info["backend"] == "native":
        assert len(measured) == 2 and set(info["prefill_ms"]) == {"native", "onnxruntime"}
        assert info["prefill"] == bc.choose(info["prefill_ms"]["native"], info["prefill_ms"]["onnxruntime"])
    else:  # ONNX Runtime runs it all, its prefills on the int8 graph
        assert len(measured) == 1 and "prefill_ms" not in info and info["prefill"] == "onnxruntime"
    ids = np.arange(3, 40, dtype=np.int64)
    through_int8 = greedy(open_decoder(lm, "target", "int4", prefill_precision="int8", backend="native"), ids, 10)
    in_c = greedy(open_decoder(lm, "target", "int4", backend="native"), ids, 10)
    for route, want in (("onnxruntime", through_int8), ("native", in_c)):
        routed = _reopen_with(cache, lm, {"backend": "native", "prefill": route}, prefill_precision="int8")
        assert isinstance(routed, NativeDecoderSession)
        assert routed.prefill_calls == 0
        assert greedy(routed, ids, 10).tokens == want.tokens
        assert (routed.prefill_calls > 0) == (route == "onnxruntime")


def test_without_a_prefill_graph_onnxruntime_may_prefill_on_the_graph_itself(lm, measured, cache):
    """No prefill graph: the other candidate is ONNX Runtime on the int4 graph itself, whose cache
    rows the C pass then decodes from (the rows ONNX Runtime's own session writes, bit for bit)."""
    sess = open_decoder(lm, "target", "int4")
    if sess.backend_info["backend"] == "native":
        assert set(sess.backend_info["prefill_ms"]) == {"native", "onnxruntime"} and len(measured) == 2
    routed = _reopen_with(cache, lm, {"backend": "native", "prefill": "onnxruntime"})
    ort_sess = open_decoder(lm, "target", "int4", backend="onnxruntime")
    ids = np.arange(5, 30, dtype=np.int64)
    assert np.array_equal(routed.prefill(ids), ort_sess.prefill(ids)) and routed.prefill_calls == 1
    for tensor in range(2 * routed.n_layers):  # [kv heads, C, head_dim] each, the first len(ids) rows written
        rows = [s._kv[tensor].reshape(s.n_heads, -1, s.head_dim)[:, :len(ids)] for s in (routed, ort_sess)]
        assert np.array_equal(*rows)


# ---- where the choice is shown ---------------------------------------------------------------------

def test_diagnostics_show_the_backend_its_variant_and_times():
    from rclpy.time import Time

    from sol_control.actions import QCVerdict
    from sol_control.decision import Decision
    from sol_control.ros.diagnostics import NodeStats

    info = {"backend": "native", "variant": "avx2", "step_ms": {"native": 0.05, "onnxruntime": 0.16},
            "verify_ms": {"native": 0.1, "onnxruntime": 0.22}, "prefill": "native", "cached": True,
            "reason": "measured"}
    st = NodeStats()
    st.record(Decision("qc", QCVerdict("crack", "reject", 0.5, 0.5, 0.8, 0.9), "fast", 4.0, 20.0, True, 1))
    extra = {"qc": {"fast_backend": "native", "fast_backend_info": info, "fast_p50_ms": 1.5}}
    msg = st.to_msg(Time().to_msg(), "active", "", extra, 0)
    qc = {kv.key: kv.value for kv in next(s for s in msg.status if s.name.endswith(": qc")).values}
    assert qc["fast_backend"] == "native" and qc["fast_backend_variant"] == "avx2"
    assert qc["fast_step_ms.native"] == "0.0500" and qc["fast_step_ms.onnxruntime"] == "0.1600"
    assert qc["fast_verify_ms.onnxruntime"] == "0.2200" and qc["fast_backend_cached"] == "true"
    assert qc["fast_prefill_backend"] == "native" and qc["fast_p50_ms"] == "1.5000"
    assert "fast_backend_info" not in qc


def test_bundle_command_shows_each_decoders_backend_and_times(grasp, capsys):
    assert main(["bundle", str(MODELS / "grasp")]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("target int8"))
    info = open_decoder(grasp, "target", "int8").backend_info  # the same choice, from the cache
    backend = f"native ({info['variant']})" if info["backend"] == "native" else "onnxruntime"
    assert backend in row and f"{info['step_ms']['native']:.3f} / {info['step_ms']['onnxruntime']:.3f}" in row
    assert "target int4: the native pass declines" in out


def test_generate_json_carries_the_backend_info(lm, tmp_path):
    out = tmp_path / "gen.json"
    args = ["generate", "--bundle", str(lm.root), "--prompt-ids", "1,100,71", "--max-new-tokens", "4",
            "--precision", "int4", "--no-draft", "--json", str(out)]
    assert main([*args, "--prefill-precision", "int8"]) == 0
    got = json.loads(out.read_text())
    info = got["backend_info"]
    assert set(info) >= KEYS and got["backend"] == info["backend"] and info["step_ms"]
    assert got["prefill_precision"] == ("int8" if info["prefill"] == "onnxruntime" else "int4")
    assert main([*args, "--backend", "onnxruntime"]) == 0
    assert json.loads(out.read_text())["backend_info"]["reason"] == "asked for: backend='onnxruntime'"
