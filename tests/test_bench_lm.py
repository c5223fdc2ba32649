"""`sol-control bench lm` on a tiny Llama written here (no 135M model, no torch), and its pure parts.

Checked: the whole path (import from a GGUF with a draft GGUF, every row at 1 and 2 threads, agent
loop, verify costs, RSS probes, summary.json / README.md / PNGs) with `--quick --no-peers`; the
summary's keys; lossless speculative rows; fp32 agreeing with itself; the bundle reused while the
sources' sha256 match and imported again when they change; speculative rows (draft model, draft
heads) stopping at a stop id where plain greedy stops; the agent loop's prompts extending each
other exactly; the agreement and ceiling formulas on given inputs. Speed is never asserted.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import gguf
import numpy as np
import pytest

from sol_control.bench import lm_bench, lm_report, lm_rows
from sol_control.bench.lm_rows import Run
from sol_control.bench.peers.common import next_loop_context
from sol_control.bench.peers.lm import lm_work
from sol_control.bundle import Bundle
from sol_control.cli import main
from sol_control.lm.gguf_writer import write_llama_gguf
from sol_control.lm.tiny import CHATML, random_llama, tiny_config, tiny_vocab
from sol_control.lm.tokenizer import LMTokenizer, build_bpe

KEYS = {"ultrafast_vs_standard_tokens", "ultrafast_vs_standard_tokens_by_threads", "ultrafast_vs_standard_loop",
        "ultrafast_vs_standard_tokens_pooled", "ultrafast_vs_standard_tokens_pooled_by_threads",
        "ultrafast_vs_standard_loop_by_threads", "ultrafast_row", "vs_best_peer", "vs_best_peer_note", "lossless",
        "lossless_detail", "ceiling_tokens", "ceiling", "verify_ms", "agreement", "agreement_int8_vs_fp32",
        "agreement_int4_vs_fp32", "energy", "rss_basis", "machine", "date", "rows", "skipped_rows", "peers",
        "workload", "bundle", "threads", "notes", "vs_best_peer_paired", "vs_best_peer_paired_by_threads", "paired",
        "vs_best_peer_paired_note"}
ROW_KEYS = {"name", "precision", "mode", "threads", "decode_tokens_per_s", "decode_tokens_per_s_pooled", "ttft_ms",
            "tokens_per_s_with_prefill", "mean_accepted", "loop_s", "cpu_s_per_query", "joules_per_query", "rss_mb", "rss_delta_mb", "outputs"}
NAMES = ["standard", "int8 plain", "int4 plain", "fp32 + draft", "int8 + draft", "int4 + draft",
         "int4-symmetric plain", "int4-symmetric + draft"]  # the last two: the second, symmetric import


def _gguf(path, seed: int):
    vocab = tiny_vocab()
    config = replace(tiny_config(len(vocab.tokens)), max_context=8192)  # the loop outgrows 256 byte-level tokens
    return write_llama_gguf(path, random_llama(config, seed=seed), vocab, embed_type=gguf.GGMLQuantizationType.Q8_0)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """(tmp root, the bundle folder, summary.json) of one quick run."""
    root = tmp_path_factory.mktemp("bench_lm")
    target, draft = _gguf(root / "tiny.gguf", 11), _gguf(root / "draft.gguf", 12)  # another model: drafts rejected
    argv = ["bench", "lm", "--gguf", str(target), "--draft", str(draft), "--import-dir", str(root / "bundle"),
            "--threads", "1,2", "--quick", "--no-peers", "--prompts", "3", "--loop-rounds", "3",
            "--max-new-tokens", "6", "--out", str(root / "out")]
    assert main(argv) == 0
    return root, root / "bundle", json.loads((root / "out" / "summary.json").read_text())


@pytest.mark.process  # the `bench` run starts RSS probes
def test_summary_has_every_key_and_row(bench):
    root, _, s = bench
    assert KEYS <= set(s), KEYS - set(s)
    assert [(r["name"], r["threads"]) for r in s["rows"]] == [(n, t) for t in (1, 2) for n in NAMES]
    for r in s["rows"]:
        assert ROW_KEYS <= set(r), (r["name"], ROW_KEYS - set(r))
        assert r["rss_mb"] > 0 and r["cpu_s_per_query"] > 0 and r["loop_s"] > 0
        assert len(r["outputs"]["prompts"]) == 3 and len(r["outputs"]["loop"]) == 3
    # the tiny bundles speculate with a draft model: only the prompt-lookup rows (not beside a draft model) are skipped
    assert s["workload"]["prompt_max_new_tokens"] == 6
    assert [r["name"] for r in s["skipped_rows"]] == ["int8 + draft + lookup", "int4 + draft + lookup",
                                                      "int4-symmetric + lookup"] * 2
    # ultrafast: the bundle's own int8 / int4 graphs, never the re-quantized symmetric one
    assert set(s["ultrafast_row"]) == {"1", "2"} and s["ultrafast_row"]["1"] in ("int8 + draft", "int4 + draft")
    assert s["ultrafast_vs_standard_tokens"] == s["ultrafast_vs_standard_tokens_by_threads"]["1"]
    by = {(r["name"], r["threads"]): r for r in s["rows"]}
    uf, std = by[s["ultrafast_row"]["1"], 1], by["standard", 1]
    assert s["ultrafast_vs_standard_tokens_pooled"] == pytest.approx(
        uf["decode_tokens_per_s_pooled"] / std["decode_tokens_per_s_pooled"])
    assert s["vs_best_peer"] is None and s["vs_best_peer_note"] == "--no-peers"
    assert s["vs_best_peer_paired"] is None and s["vs_best_peer_paired_note"] == "not run: no peer row"
    assert s["energy"]["basis"] in ("measured", "estimated") and s["energy"]["assumption"]
    c = s["ceiling"]["1"]
    assert s["ceiling_tokens"] == pytest.approx(lm_report.ceiling(c["k"], c["standard_ms_per_token"], c["verify_ms"]))
    assert set(s["verify_ms"]["1"]) == {"fp32", "int8", "int4", "int4-symmetric"}
    assert {"1", "2", "5", "9"} <= set(s["verify_ms"]["1"]["int4"])
    for name in ("decode_tokens_per_s.png", "agent_loop.png"):
        assert (root / "out" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ultrafast" in (root / "out" / "README.md").read_text()


@pytest.mark.process  # the `bench` run starts RSS probes
def test_speculative_rows_are_lossless_and_fp32_agrees_with_itself(bench):
    _, _, s = bench
    assert s["lossless"] is True and len(s["lossless_detail"]) == 8
    sym = next(d for d in s["lossless_detail"] if d["row"] == "int4-symmetric + draft")
    assert sym["equal_to"] == "int4-symmetric plain"  # each speculative row against plain on its own graph
    assert all(d["lossless"] for d in s["lossless_detail"])
    for t in ("1", "2"):
        for part in ("prompts", "loop"):
            a = s["agreement"][t]["standard"][part]
            assert a["tokens_equal_share"] == 1.0 and a["answers_equal_share"] == 1.0
            assert a["first_difference"] == [None] * len(a["first_difference"])
            assert s["agreement"][t]["fp32 + draft"][part]["answers_equal_share"] == 1.0


@pytest.mark.process  # the `bench` run starts RSS probes
def test_bundle_is_reused_until_a_source_changes(bench, monkeypatch):
    root, bundle, _ = bench
    stamp = (bundle / "manifest.json").stat().st_mtime_ns
    assert lm_bench.ensure_bundle(root / "tiny.gguf", bundle, None, root / "draft.gguf") == bundle
    assert (bundle / "manifest.json").stat().st_mtime_ns == stamp  # same sha256 key: not imported again
    calls = []

    def fake_import(argv):
        calls.append(argv)
        out = Path(argv[argv.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "manifest.json").write_text("{}")
        return 0

    monkeypatch.setattr("sol_control.cli.main", fake_import)
    other = root / "other_bundle"
    lm_bench.ensure_bundle(root / "tiny.gguf", other, None, None)
    lm_bench.ensure_bundle(root / "tiny.gguf", other, None, None)
    assert len(calls) == 1  # the second call found its key
    lm_bench.ensure_bundle(root / "tiny.gguf", other, None, root / "draft.gguf")
    assert len(calls) == 2 and "--draft" in calls[-1]  # a new draft: imported again


@pytest.mark.process  # the `bench` run starts RSS probes
def test_sources_symmetric_import_only_from_a_gguf_and_not_with_no_symmetric(bench):
    from argparse import Namespace

    root, bundle, _ = bench
    args = Namespace(bundle=None, gguf=root / "tiny.gguf", draft=root / "draft.gguf", heads=None,
                     symmetric_heads=None, import_dir=bundle, no_symmetric=False)
    folder, (symmetric, with_heads), gguf = lm_bench._sources(args)  # both keys found: nothing imported again
    assert (folder, gguf) == (bundle, root / "tiny.gguf") and symmetric.root == root / "bundle_symmetric"
    assert with_heads is None  # no symmetric heads for a model other than SmolLM2 unless given
    assert lm_bench._sources(Namespace(**{**vars(args), "no_symmetric": True}))[1] == [None, None]
    given = lm_bench._sources(Namespace(**{**vars(args), "bundle": bundle}))
    assert given == (bundle, [None, None], root / "tiny.gguf")  # --bundle: run as it is, no second import


@pytest.mark.process  # the `bench` run starts RSS probes
def test_symmetric_heads_are_a_third_import_with_a_lossless_heads_and_lookup_row(bench, tmp_path):
    """--symmetric-heads: the symmetric import again, with those heads and without the draft model;
    its one row, "int4-symmetric + draft + lookup", speculates with the heads and prompt lookup and
    answers as the headless symmetric import's plain row does."""
    from argparse import Namespace

    from sol_control.graph.weights import DraftHeads

    root, bundle, _ = bench
    hidden = Bundle.load(bundle).manifest.target.hidden_size
    w1, w_prev = 0.05 * np.random.default_rng(3).standard_normal((2, 3, hidden, hidden)).astype(np.float32)
    heads = tmp_path / "sym_heads.npz"
    DraftHeads(w1, None, 0, w_prev).save(heads)  # 3 chained heads, as tools/train_lm_heads.py --chain
    args = Namespace(bundle=None, gguf=root / "tiny.gguf", draft=root / "draft.gguf", heads=None,
                     symmetric_heads=heads, import_dir=bundle, no_symmetric=False)
    _, (symmetric, with_heads), _ = lm_bench._sources(args)
    assert with_heads.root == root / "bundle_symmetric_heads"
    m = with_heads.manifest
    assert (m.draft, m.target.draft_heads, m.metrics["import"]["target"]["int4_mode"]) == (None, 3, "symmetric")
    rows, skipped = lm_rows.make_rows(Bundle.load(bundle), [1], symmetric, with_heads)
    mine = {r.name: r for r in rows if r.precision == lm_rows.SYMMETRIC}
    assert mine["int4-symmetric + draft + lookup"].mode == "heads" and rows[-1].name == "int4-symmetric + draft + lookup"
    tok = _tok()
    for text in ("the part the part the part", "move the arm to bin 3"):
        ids = tok.encode(text)
        plain, spec = (mine[n].generate(ids, 12, (), fresh=True) for n in ("int4-symmetric plain",
                                                                            "int4-symmetric + draft + lookup"))
        assert spec.tokens == plain.tokens and len(plain.tokens) == 12
    with pytest.raises(ValueError, match="--symmetric-heads"):
        lm_bench._sources(Namespace(**{**vars(args), "symmetric_heads": tmp_path / "missing.npz"}))


@pytest.mark.process  # the `bench` run starts RSS probes
def test_speculative_row_stops_where_plain_greedy_stops(bench):
    _, bundle, _ = bench
    b = Bundle.load(bundle)
    rows, _ = lm_rows.make_rows(b, [1])
    plain, spec = rows[1], rows[4]  # int8 plain, int8 + draft
    prompt = [1, 100, 71, 234, 5, 40, 41]
    free = plain.generate(prompt, 16, (), fresh=True).tokens
    i = next(i for i in range(2, len(free)) if free[i] not in free[:i])  # a token first seen at i
    got = spec.generate(prompt, 16, (free[i],), fresh=True)
    assert got.tokens == free[:i + 1] == plain.generate(prompt, 16, (free[i],), fresh=True).tokens


@pytest.mark.process  # the `bench` run starts RSS probes
def test_paired_rounds_alternate_the_peer_row_and_ours_prompt_by_prompt(bench):
    """Each round answers every prompt with the peer and with our row (real sessions of the tiny
    bundle), who goes first alternating prompt by prompt and round by round; a round's ratio is our
    median over the peer's, the headline the median of the rounds'. The peer's tokens/s come from a
    stand-in: the peer engines' venvs are not part of `make test` (PeerServer has its own test)."""
    from contextlib import contextmanager

    from sol_control.bench.lm_report import paired_summary

    _, bundle, s = bench
    rows, _ = lm_rows.make_rows(Bundle.load(bundle), [1])
    tok, calls = _tok(), []
    workload = {"prompts": ["move the arm", "status of line 2", "stop"], "max_new_tokens": 6}
    speeds = {0: 50.0, 1: 1e9, 2: 1e-9}  # by round: round 2 far faster, round 3 far slower

    class Peer:
        def decode_tokens_per_s(self, ids, max_new):
            calls.append(("peer", tuple(ids), max_new))
            return speeds[sum(c[0] == "peer" for c in calls[:-1]) // 3]

    @contextmanager
    def open_peer(t, peer):
        calls.append(("open", t, peer["engine"]))
        yield Peer()

    ours = rows[4]  # int8 + draft (the summary names no ultrafast row: it alone is paired)
    real_generate = ours.generate
    def counted(ids, *a, **k):
        calls.append(("ours", tuple(ids)))
        return real_generate(ids, *a, **k)
    ours.generate = counted
    summary = {"threads": [1], "best_peer": {"1": {"ours": {"name": ours.name}, "peer": {"engine": "x"}}}}
    got = paired_summary(summary, rows, tok, workload, Path("model.gguf"), 3, open_peer)
    assert calls[0] == ("open", 1, "x") and [c for c in calls if c[0] == "open"] == [calls[0]]
    order = [c[0] for c in calls[1:]]
    assert order == ["peer", "ours", "ours", "peer", "peer", "ours",  # round 1: peer first on prompts 1 and 3
                     "ours", "peer", "peer", "ours", "ours", "peer",  # round 2: the other way round
                     "peer", "ours", "ours", "peer", "peer", "ours"]
    prompts = [tuple(tok.encode_chat([{"role": "user", "content": p}])) for p in workload["prompts"]]
    pairs = list(zip(calls[1::2], calls[2::2]))
    assert [(a[1], b[1]) for a, b in pairs] == [(p, p) for p in prompts] * 3  # both answer the same prompt
    assert {c[2] for c in calls if c[0] == "peer"} == {6}
    rounds = got["paired"]["1"]["rounds"]
    assert [r["peer_tokens_per_s"] for r in rounds] == [50.0, 1e9, 1e-9]
    ratio = rounds[0]["rows"][ours.name]["ratio"]
    assert got["vs_best_peer_paired"] == got["vs_best_peer_paired_by_threads"]["1"] == ratio
    assert got["vs_best_peer_paired_ultrafast"] == ratio  # the same row
    assert ratio == rounds[0]["rows"][ours.name]["tokens_per_s"] / 50.0 > 0
    off = paired_summary(summary, rows, tok, workload, Path("model.gguf"), 0, open_peer)
    assert off["vs_best_peer_paired"] is None and off["vs_best_peer_paired_note"] == "not run: --paired 0"


@pytest.mark.process  # the `bench` run starts RSS probes
def test_paired_rounds_rotate_the_peer_our_best_and_the_ultrafast_row(bench):
    """Our best row and the ultrafast row (another row) share the rounds with the peer; who goes
    first rotates over the three, prompt by prompt and round by round; each row has its own ratio."""
    from contextlib import contextmanager

    from sol_control.bench.lm_report import paired_summary

    root, bundle, _ = bench
    rows, _ = lm_rows.make_rows(Bundle.load(bundle), [1], Bundle.load(root / "bundle_symmetric"))
    best, uf = rows[-1], rows[5]  # int4-symmetric + draft, int4 + draft
    tok, calls = _tok(), []
    workload = {"prompts": ["move the arm", "status of line 2", "stop"], "max_new_tokens": 6}

    class Peer:
        def decode_tokens_per_s(self, ids, max_new):
            calls.append("peer")
            return 40.0

    @contextmanager
    def open_peer(t, peer):
        yield Peer()

    for r in (best, uf):
        r.generate = (lambda real, name: lambda *a, **k: calls.append(name) or real(*a, **k))(r.generate, r.name)
    summary = {"threads": [1], "ultrafast_row": {"1": uf.name},
               "best_peer": {"1": {"ours": {"name": best.name}, "peer": {"engine": "x"}}}}
    got = paired_summary(summary, rows, tok, workload, Path("model.gguf"), 2, open_peer)
    order = ["peer", best.name, uf.name]
    assert calls == [n for i in range(2) for j in range(3) for n in order[(i + j) % 3:] + order[:(i + j) % 3]]
    rounds = got["paired"]["1"]["rounds"]
    assert set(rounds[0]["rows"]) == {best.name, uf.name}
    for key, name in (("vs_best_peer_paired", best.name), ("vs_best_peer_paired_ultrafast", uf.name)):
        ratios = sorted(r["rows"][name]["tokens_per_s"] / 40.0 for r in rounds)
        assert got[key] == got[f"{key}_by_threads"]["1"] == pytest.approx(sum(ratios) / 2)  # median of two rounds


@pytest.mark.process  # the `bench` run starts RSS probes
def test_symmetric_rows_run_the_requantized_int4_graph(bench):
    """The int4-symmetric rows open the second import's int4 graph: symmetric 4-bit blocks, the head
    too (no mins term), not the bundle's Q4_1 blocks."""
    import onnx

    root, bundle, s = bench
    sym = root / "bundle_symmetric"
    assert json.loads((sym.with_name(sym.name + ".key.json")).read_text())["int4_mode"] == "symmetric"
    def ops(folder):
        g = onnx.load(str(folder / "target_int4.onnx"), load_external_data=False).graph
        return [n.op_type for n in g.node]
    assert "MatMul" in ops(bundle)  # the Q4_1 blocks' mins term: blocksum(x) @ M.T
    assert "MatMul" not in ops(sym) and ops(sym).count("MatMulNBits") > ops(bundle).count("MatMulNBits")  # + the head
    assert Bundle.load(bundle).manifest.metrics["import"]["target"]["int4_mode"] == "fast"
    assert Bundle.load(sym).manifest.metrics["import"]["target"]["int4_mode"] == "symmetric"
    rows = {r["name"]: r for r in s["rows"] if r["threads"] == 1}
    assert rows["int4-symmetric plain"]["precision"] == "int4-symmetric" and rows["int4-symmetric plain"]["rss_mb"] > 0
    assert s["agreement_int4_symmetric_vs_fp32"]["prompts"]["tokens_equal_share"] is not None


@pytest.mark.process  # the `bench` run starts RSS probes
def test_symmetric_import_without_a_draft_gets_a_prompt_lookup_row(bench, tmp_path):
    """Imported without a draft (and, as the bench imports it, without heads), the symmetric bundle's
    rows are plain and prompt lookup alone ("+ lookup", mode "lookup"), which answers as plain does."""
    root, bundle, _ = bench
    sym = tmp_path / "sym"
    assert main(["import", str(root / "tiny.gguf"), "--out", str(sym), "--quantize", "int4",
                 "--int4-mode", "symmetric"]) == 0
    rows, skipped = lm_rows.make_rows(Bundle.load(bundle), [1], Bundle.load(sym))
    mine = {r.name: r for r in rows if r.precision == lm_rows.SYMMETRIC}
    assert {n: r.mode for n, r in mine.items()} == {"int4-symmetric plain": "plain", "int4-symmetric + lookup": "lookup"}
    assert "int4-symmetric + draft" in [r["name"] for r in skipped]
    tok, stops = _tok(), ()
    ids = tok.encode("the part the part the part")
    runs = [mine[n].generate(ids, 12, stops, fresh=True) for n in ("int4-symmetric plain", "int4-symmetric + lookup")]
    assert runs[0].tokens == runs[1].tokens and len(runs[1].tokens) == 12


def test_ultrafast_is_the_bundles_own_and_the_best_peer_ratio_takes_every_row():
    rows = [{"name": "int4 + draft", "precision": "int4", "speculative": True, "decode_tokens_per_s": 50.0},
            {"name": "int4-symmetric + lookup", "precision": "int4-symmetric", "speculative": True,
             "decode_tokens_per_s": 80.0}]
    uf, _ = lm_report._ultrafast(rows)
    assert uf["name"] == "int4 + draft"
    peer = [{"threads": 1, "engine": "e", "decode_tokens_per_s": 40.0}]
    best, ultrafast, named = lm_report._best_peer(rows, peer, 1, uf)
    assert (best, ultrafast, named["ours"]["name"]) == (2.0, 1.25, "int4-symmetric + lookup")


def _tok() -> LMTokenizer:
    v = tiny_vocab()
    return LMTokenizer(build_bpe(v.tokens, v.token_types, v.merges, v.pre), (0, 2), CHATML)


def test_loop_prompts_extend_each_other_exactly():
    """The agent loop's rounds as `lm_rows.run_workload` builds them (the peers' ids: `peers.lm.lm_work`)."""
    tok = _tok()
    system, results = "You control a QC cell.", ["qc/verdict: part 1041 reject"] + [f"tool result {k}" for k in range(3)]
    w = lm_work(tok, {"prompts": [], "agent_loop": {"system": system, "tool_results": results}})
    messages = [{"role": "system", "content": system}, {"role": "user", "content": results[0]}]
    ids = w.loop_first
    assert ids == tok.encode_chat(messages)
    action = tok.encode('{"action": "divert", "part": 1041}')
    answers = [action + [2], action[:5], action + [0]]  # stopped, cut at max_new_tokens, other stop id
    for k, answer in enumerate(answers):
        before = list(ids)
        ids = next_loop_context(ids, answer, w.loop_turns[k], w.close, w.stop_ids)
        kept = answer[:-1] if answer[-1] == 0 else answer  # <|endoftext|>: the template closes with <|im_end|>
        content = answer[:-1] if answer[-1] in (0, 2) else answer
        messages += [{"role": "assistant", "content": tok.decode(content)}, {"role": "user", "content": results[k + 1]}]
        assert ids[:len(before) + len(kept)] == before + kept  # the cache carries over whole
        assert tok.decode(ids) == tok.render_chat(messages)  # and the text is the template's
        assert tok.decode(ids).endswith(f"tool result {k}<|im_end|>\n<|im_start|>assistant\n")


def test_first_difference_and_agreement():
    assert lm_report.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert lm_report.first_difference([1, 9, 3], [1, 2, 3]) == 1
    assert lm_report.first_difference([1, 2], [1, 2, 3]) == 2
    a = lm_report.agreement([[1, 2, 3, 4], [5, 6], [7, 8]], [[1, 2, 0, 0], [5, 6], [7]])
    assert a["first_difference"] == [2, None, 1]
    assert a["tokens_equal_share"] == pytest.approx((2 + 2 + 1) / (4 + 2 + 1))
    assert a["answers_equal_share"] == pytest.approx(1 / 3)
    assert a["first_difference_median"] == 1.5
    same = lm_report.agreement([[1, 2], [3]], [[1, 2], [3]])
    assert same["tokens_equal_share"] == same["answers_equal_share"] == 1.0 and same["first_difference_median"] is None


def test_pooled_rate_is_all_tokens_over_all_time_not_the_median_prompts():
    runs = [Run([1] * 11, 5.0, 105.0, 0.0, 5), Run([1] * 3, 5.0, 105.0, 0.0, 2), Run([1] * 5, 5.0, 45.0, 0.0, 3)]
    # per prompt 100, 20 and 100 tok/s: median 100; pooled (10 + 2 + 4) tokens / (100 + 100 + 40) ms
    assert [r.decode_tokens_per_s for r in runs] == pytest.approx([100.0, 20.0, 100.0])
    assert lm_report.pooled_rate(runs) == pytest.approx(16 / 240 * 1e3)
    assert lm_report.pooled_rate([Run([1], 5.0, 5.0, 0.0, 0)]) is None  # one token: no decode time


def test_ceiling_formula():
    # k = 4 guesses: one call of 5 tokens costs 60 ms against 40 ms per standard token -> 5 x 40 / 60
    assert lm_report.ceiling(4, 40.0, 60.0) == pytest.approx(10 / 3)
    assert lm_report.ceiling(8, 10.0, 90.0) == pytest.approx(1.0)  # a verify as dear as 9 tokens: no gain


def test_heads_row_stops_where_plain_greedy_stops():
    """The draft-heads path (`speculate_heads` with stop ids) on the shipped grasp bundle."""
    from sol_control.bench.decode_bench import decision_prefixes
    from sol_control.decoding import open_decoder

    from .conftest import bundle_dir

    root = bundle_dir("grasp")
    assert root is not None, "the shipped grasp bundle (models/grasp) is missing"
    b = Bundle.load(root)
    assert b.manifest.target.draft_heads > 0
    prefix = [int(t) for t in decision_prefixes(b, 1)[0]]
    n = b.manifest.max_context - len(prefix)
    plain = lm_rows.Row("plain", "int4", "plain", open_decoder(b, "target", "int4"))
    heads = lm_rows.Row("heads", "int4", "heads", open_decoder(b, "target", "int4"))
    free = plain.generate(prefix, n, (), fresh=True).tokens
    assert heads.generate(prefix, n, (), fresh=True).tokens == free
    i = next(i for i in range(2, len(free)) if free[i] not in free[:i])
    got = heads.generate(prefix, n, (free[i],), fresh=True)
    assert got.tokens == free[:i + 1] and got.target_calls <= i


def test_peer_precisions_filter_the_peer_rows():
    from sol_control.bench.lm_bench import _peer_modes
    from sol_control.bench.peers.lm import LM_MODES

    quantized = _peer_modes("int8, int4")
    assert set(quantized) == set(LM_MODES) and quantized["transformers"] == []
    assert all(p in ("int8", "int4") for modes in quantized.values() for p, _ in modes)
    assert ("int4", "ngram") in quantized["ort-genai"] and _peer_modes("fp32,int8,int4") == LM_MODES
    for bad in ("int3", "", "fp32,bf16"):
        with pytest.raises(ValueError, match="--peer-precisions"):
            _peer_modes(bad)
