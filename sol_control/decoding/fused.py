"""A decoder in the "fused" graph layout (sol_control.graph.llama) with its KV cache, allocated once.

    input_ids [1, T] int64, seqlens_k [1] int32 (= L + T - 1 + p), total_sequence_length [] int32
    (= L + T + p), guesses [] int64 (G), past_key_values.{i}.key|value [1, H, C, D],
    optional query_pad [1] int64 (p), optional heads_on [] bool (graphs with heads: `use_heads`)
      ->  logits [1, G+1, V] (the last G+1 rows), present.{i}.key|value [1, H, C, D],
          with draft heads: accepted [1] int64, head_ids [1, 1, K] int64, probs [1, G+1] float32
    (P = the graph's `query_pad` metadata, C = max_context + P; p = 1 if T == 1 else 0 where the
    graph takes the `query_pad` input, else p = P)

Past and present of each layer are bound to one preallocated buffer of C positions
(GroupQueryAttention's past_present_share_buffer): a call writes its new rows from L on in place and
reads rows [0, L+T). So the cache is never copied: `rewind(n)` only moves the length, and the next
call overwrites the dropped rows. A call writes ids and three scalars into preallocated arrays and
runs the IO binding made for its shape (T, rows read) the first time that shape came (`_Binding`:
binding anew at every change cost ~19 µs a grasp call). `forward(ids, rows)` returns the last
`rows` rows' logits (default all T, at most `max_rows`); `prefill` reads one row, so the lm_head
runs once per prefill, not once per prefix token, in chunks of up to `max_step_tokens` (512) ids.

With the query pad (the builder's default; a graph with the pad input gets the pad row in one-token
calls only) a one-token pass gives bit for bit the logits the same token gets inside a
multi-token verify pass wherever the linears' kernels treat rows alike: fp32 and the int8 integer
GEMMs on every CPU, 4-bit MatMulNBits (int8 activations) on AVX-512 but not on AVX2, whose one-row
kernel rounds differently. So a session probes its graph when it opens
(`exact_rows()`, unless `min_step_tokens` is given) and falls back to exact mode,
`min_step_tokens=2` (a lone new token is run with the previous one, a first token twice), where
rows differ; then speculative decoding still equals plain greedy.

A second graph of the same model for prefills (`prefill_path`, e.g. the int8 graph beside an int4
one): `prefill` runs through it, on the same KV buffers (both graphs bind [1, kv, C, D] per layer),
`forward` (decoding steps, verify passes) through the main graph. Where the CPU multiplies int8
with VNNI, ONNX Runtime's 4-bit kernel is the slow one on many rows (SmolLM2: a 64-token prefill
241 ms through the int4 graph, 130 ms through the int8 one; without VNNI 230 vs 327 ms, so
`factory.default_prefill` picks int8 only with it; docs/BENCHMARKS.md). Plain and speculative decoding prefill alike, so speculative still
equals plain greedy. In exact mode the last prefix token goes through the main graph (paired with
the one before it): plain decoding's first step runs it again there, and a verify pass does not,
so with the prefill graph's numbers in its cache row the two would part (SmolLM2 int4 on an AVX2
host: 13 of 20 workload answers).

A `decoder.Decoder`, as `DecoderSession` is, so `greedy` and `speculate` run on either.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort

from .session import _fast_binding, exact_pair, session_options

_I64, _I32, _F32 = np.dtype(np.int64), np.dtype(np.int32), np.dtype(np.float32)
LAYOUT = "sol_control.fused/2"
INPUTS = ("input_ids", "seqlens_k", "total_sequence_length", "guesses")
PAD_INPUT = "query_pad"  # optional: the query pad's rows this call
HEADS_INPUT = "heads_on"  # optional (graphs with draft heads): run the heads this call
_BOOL = np.dtype(np.bool_)


def _expect(ok: bool, where: str, what: str) -> None:
    if not ok:
        raise ValueError(f"{where}: {what} (fused layout {LAYOUT} expected)")


def check_fused_signature(sess: ort.InferenceSession, where: str) -> tuple[int, int, int, int, int]:
    """Validate the fused layout; return (n_layers, kv_heads, head_dim, vocab, capacity C)."""
    inputs = {i.name: i for i in sess.get_inputs()}
    outputs = {o.name: o for o in sess.get_outputs()}
    types = {"input_ids": "tensor(int64)", "seqlens_k": "tensor(int32)", "total_sequence_length": "tensor(int32)",
             "guesses": "tensor(int64)"}
    for name, kind in types.items():
        _expect(name in inputs, where, f"missing input {name!r}")
        _expect(inputs[name].type == kind, where, f"input {name!r} must be {kind}, got {inputs[name].type}")
    n_layers = sum(1 for n in inputs if n.startswith("past_key_values.")) // 2
    _expect(n_layers > 0, where, "no past_key_values.* inputs")
    shape = inputs["past_key_values.0.key"].shape
    _expect(len(shape) == 4 and all(isinstance(d, int) for d in shape[1:]), where,
            f"past_key_values.0.key must be [1, heads, C, head_dim] with static sizes, got {shape}")
    for i in range(n_layers):
        for kind in ("key", "value"):
            past, present = f"past_key_values.{i}.{kind}", f"present.{i}.{kind}"
            _expect(past in inputs and inputs[past].shape == shape, where, f"input {past!r} must be {shape}")
            _expect(present in outputs and outputs[present].shape == shape, where, f"output {present!r} must be {shape}")
    if PAD_INPUT in inputs:
        _expect(inputs[PAD_INPUT].type == "tensor(int64)" and inputs[PAD_INPUT].shape == [1], where,
                f"input {PAD_INPUT!r} must be int64 [1], got {inputs[PAD_INPUT].type} {inputs[PAD_INPUT].shape}")
    if HEADS_INPUT in inputs:
        _expect(inputs[HEADS_INPUT].type == "tensor(bool)" and inputs[HEADS_INPUT].shape == [], where,
                f"input {HEADS_INPUT!r} must be bool [], got {inputs[HEADS_INPUT].type} {inputs[HEADS_INPUT].shape}")
    _expect(len(inputs) == 4 + 2 * n_layers + (PAD_INPUT in inputs) + (HEADS_INPUT in inputs), where,
            f"unexpected inputs {sorted(inputs)}")
    _expect("logits" in outputs and isinstance(outputs["logits"].shape[-1], int), where,
            "output 'logits' [1, T, vocab] with a static vocab is missing")
    return n_layers, shape[1], shape[3], outputs["logits"].shape[-1], shape[2]


def graph_traits(sess: ort.InferenceSession, where: str) -> tuple[int, int, int, int, int, int, int, bool, bool]:
    """A fused graph's (n_layers, kv_heads, head_dim, vocab, capacity C, query_pad P, draft heads,
    has probs, pad is an input), validated: what two graphs on one cache must share."""
    signature = check_fused_signature(sess, where)
    meta = sess.get_modelmeta().custom_metadata_map
    pad = int(meta.get("query_pad", "0"))  # 1: attention runs one extra query row (cache row L+T)
    if pad not in (0, 1):
        raise ValueError(f"{where}: metadata query_pad must be 0 or 1, got {meta['query_pad']!r}")
    outputs = {o.name: o for o in sess.get_outputs()}
    heads = int(outputs["head_ids"].shape[-1]) if "head_ids" in outputs else 0
    pad_input = PAD_INPUT in {i.name for i in sess.get_inputs()}
    if pad_input and pad != 1:
        raise ValueError(f"{where}: a {PAD_INPUT!r} input needs metadata query_pad 1 (a cache row for it), got {pad}")
    # graphs built before `probs` / the pad input came have neither
    return (*signature, pad, heads, "probs" in outputs, pad_input)


class FusedDecoderSession:
    """A causal decoder in the fused layout with a KV cache of `max_context` positions (batch 1)."""

    backend_info: dict | None = None  # set by factory.open_decoder

    def __init__(self, path: str | Path, max_context: int | None = None, threads: int = 1, name: str = "",
                 max_step_tokens: int = 512, min_step_tokens: int | None = None, max_rows: int = 64,
                 options: ort.SessionOptions | None = None, prefill_path: str | Path | None = None):
        self.name = name or Path(path).stem
        self.path = Path(path)
        self.session = self._open(path, options, threads)
        self._traits = graph_traits(self.session, f"decoder {self.path}")
        (self.n_layers, self.n_heads, self.head_dim, self.vocab, capacity, self._pad, self.draft_heads,
         self._has_probs, self._pad_input) = self._traits
        capacity -= self._pad
        if max_context is not None and not 0 < max_context <= capacity:
            raise ValueError(f"max_context must be in 1..{capacity} (the graph's KV length), got {max_context}")
        self.max_context = max_context or capacity
        self.max_step_tokens = min(max_step_tokens, self.max_context)  # ids per call (a prefill chunk)
        self.max_rows = min(max_rows, self.max_step_tokens)  # logits rows a call may return
        if min_step_tokens not in (None, 1, 2):
            raise ValueError(f"min_step_tokens must be 1 or 2, got {min_step_tokens}")
        self.min_step_tokens = min_step_tokens or 1  # 2: a lone new token is run with the previous one
        H, D, n_kv = self.n_heads, self.head_dim, 2 * self.n_layers
        self._kv = np.zeros((n_kv, H * (capacity + self._pad) * D), np.float32)  # [tensor, H*C*D], past = present
        self._logits = np.zeros(self.max_rows * self.vocab, np.float32)
        self._ids = np.zeros(self.max_step_tokens, np.int64)
        self._pair = np.zeros(2, np.int64)
        self._seqlens = np.zeros(1, np.int32)  # L + T - 1 + pad
        self._total = np.zeros((), np.int32)  # L + T + pad
        self._guesses = np.zeros((), np.int64)  # G: logits for the last G + 1 rows
        self._pad_rows = np.full(1, self._pad, np.int64)  # p this call (read by graphs with the input)
        self.tokens = np.zeros(self.max_context, np.int64)  # the ids whose keys/values are in the cache
        self.length = 0
        self.calls = 0
        self.guesser = None  # an AnswerGuesser for the prefill (open_decoder: the bundle's target.guesses)
        self._heads = np.zeros(max(self.draft_heads, 1), np.int64)
        self._heads_on = np.ones((), np.bool_)  # graphs with the heads_on input run their heads only when set
        self._heads_mode = 1  # use_heads: 0 off, 1 on, 2 on where a guess was rejected
        self._accepted = np.zeros(2, np.int64)  # the graph's `accepted`; the native pass adds its row's argmax
        self._probs = np.zeros(self.max_rows, np.float32)
        self._main = _Binding(self.session, self._bind_static)
        self._switch = HEADS_INPUT in self._main.inputs
        self._prefill = None
        if prefill_path is not None:
            self._prefill = _Binding(self._open(prefill_path, options, threads), self._bind_static)
            traits = graph_traits(self._prefill.session, f"prefill graph {prefill_path}")
            if traits != self._traits:
                raise ValueError(f"prefill graph {prefill_path} does not match {self.path}: (layers, kv heads, "
                                 f"head dim, vocab, capacity, query pad, draft heads, probs, pad input) "
                                 f"{traits} vs {self._traits}")
        self._capacity = capacity + self._pad  # cache rows in the graph
        self._bound = self._main.bound
        if min_step_tokens is None:  # the exactness rule: probe this graph on this CPU
            self.min_step_tokens = 1 if self.exact_rows() else 2

    @staticmethod
    def _open(path, options: ort.SessionOptions | None, threads: int) -> ort.InferenceSession:
        try:
            return ort.InferenceSession(str(path), options or session_options(threads), providers=["CPUExecutionProvider"])
        except Exception as e:  # ORT's own exception types: invalid graph, unknown op, ...
            raise ValueError(f"decoder {path}: ONNX Runtime cannot load it: {e}") from None

    def _bind_static(self, b: "_Binding", bind_in, bind_out) -> None:
        """Bind what every call of `b`'s session shares: the KV cache (past = present, in place), the scalars."""
        shape = (1, self.n_heads, self._capacity, self.head_dim)
        for j in range(2 * self.n_layers):
            layer, kind = divmod(j, 2)
            name = ("key", "value")[kind]
            ptr = int(self._kv[j].ctypes.data)
            bind_in(f"past_key_values.{layer}.{name}", _F32, shape, ptr)
            bind_out(f"present.{layer}.{name}", _F32, shape, ptr)
        bind_in("seqlens_k", _I32, (1,), int(self._seqlens.ctypes.data))
        bind_in("total_sequence_length", _I32, (), int(self._total.ctypes.data))
        bind_in("guesses", _I64, (), int(self._guesses.ctypes.data))
        if self._pad_input:
            bind_in(PAD_INPUT, _I64, (1,), int(self._pad_rows.ctypes.data))
        if HEADS_INPUT in b.inputs:
            bind_in(HEADS_INPUT, _BOOL, (), int(self._heads_on.ctypes.data))
        if self.draft_heads:
            bind_out("accepted", _I64, (1,), int(self._accepted.ctypes.data))
            bind_out("head_ids", _I64, (1, 1, self.draft_heads), int(self._heads.ctypes.data))

    def _bind_shape(self, T: int, rows: int):
        """A binder of what depends on the call's shape: input_ids [1, T], logits (and probs) of `rows`."""
        def bind(bind_in, bind_out) -> None:
            bind_in("input_ids", _I64, (1, T), int(self._ids.ctypes.data))
            bind_out("logits", _F32, (1, rows, self.vocab), int(self._logits.ctypes.data))
            if self._has_probs:
                bind_out("probs", _F32, (1, rows), int(self._probs.ctypes.data))
        return bind

    # -- cache bookkeeping ------------------------------------------------------------------
    def reset(self) -> None:
        self.length = 0

    def rewind(self, n_keep: int) -> None:
        """Forget cached positions past `n_keep` (no copy: the next call overwrites them)."""
        assert 0 <= n_keep <= self.length, (n_keep, self.length)
        self.length = n_keep

    def use_heads(self, on: bool, last: bool = False) -> None:
        """Run the draft heads in the next calls or not (plain decoding reads no `head_ids`). Graphs
        without the `heads_on` input (built before it) run them always. `last`: the next calls may
        end the answer, so their guesses matter only where a guess is rejected: the native pass then
        skips the heads when every guess is right (`head_ids` zeros); ONNX Runtime's graphs run them."""
        self._heads_on[()] = on or not self._switch
        self._heads_mode = 2 if on and last else int(self._heads_on)  # the native pass's heads_on

    # -- forward ----------------------------------------------------------------------------
    def forward(self, ids: np.ndarray, rows: int | None = None) -> np.ndarray:
        """Append `ids` to the cache; return the logits [rows, vocab] of their last `rows` (default:
        all of them): a view, valid until the next call. With draft heads, the last rows - 1 ids are
        guesses the graph checks (`accepted`, `head_ids`)."""
        return self._forward(ids, rows, self._main)

    def _forward(self, ids: np.ndarray, rows: int | None, b: "_Binding") -> np.ndarray:
        T, L = len(ids), self.length
        if T:
            # a verify pass's few ids: as a list (numpy's reductions here cost ~10 µs of the next ORT run)
            low, high = (int(ids.min()), int(ids.max())) if T > 16 else (min(ids.tolist()), max(ids.tolist()))
            if low < 0 or high >= self.vocab:
                raise ValueError(f"{self.name}: token ids must lie in [0, {self.vocab}), got [{low}, {high}]")
        if T == 1 and self.min_step_tokens == 2:  # exact mode: never one row alone
            row = exact_pair(self._pair, self.tokens, L, ids[0])
            self.rewind(L - row)
            logits = self._run(self._pair, 2 - row, b)[:1]  # logits from the new token's row on
            self.rewind(L + 1)
            return logits
        return self._run(ids, T if rows is None else rows, b)

    def prefill(self, prefix: np.ndarray) -> np.ndarray:
        """Make the cache hold `prefix`, reusing its longest cached leading part; return the last
        position's logits [vocab] (with draft heads: `head_ids` guess what follows). Long prefixes
        run in chunks of `max_step_tokens`; every chunk reads one row of logits."""
        return self._prefill_rows(prefix, 1)[-1]

    @property
    def can_guess_prefill(self) -> bool:
        """Can `prefill_guessed` run here: only without a second prefill graph, whose rows a plain
        prefill would put where the guesses' check needs the main graph's."""
        return self._prefill is None

    def prefill_guessed(self, ids: np.ndarray, guesses: int) -> np.ndarray:
        """`prefill` of `ids` whose last `guesses` ids are guesses of what follows the prefix
        before them: the last call runs the prefix's last token and the guesses, so the graph
        checks them as in a verify pass (`accepted`, `head_ids`); the logits [guesses + 1, vocab]
        of those rows. The prefix's rows are the ones `prefill` would compute (rows do not depend on
        how many tokens share a pass), so the caller can emit exactly what plain greedy would."""
        if not self.can_guess_prefill:
            raise ValueError(f"{self.name}: guessed prefills need the main graph alone (no prefill graph)")
        if not 0 <= guesses < len(ids) or guesses + 1 > self.max_rows:
            raise ValueError(f"{self.name}: {guesses} guesses need a prefix before them and at most "
                             f"max_rows={self.max_rows} rows, got {len(ids)} ids")
        return self._prefill_rows(ids, guesses + 1)

    def _prefill_rows(self, prefix: np.ndarray, rows: int) -> np.ndarray:
        n = len(prefix)
        if n == 0:
            raise ValueError(f"{self.name}: empty prefix")
        m = min(self.length, n)
        same = int(np.argmin(np.append(self.tokens[:m] == prefix[:m], False)))
        self.rewind(min(same, n - rows))  # the last `rows` ids are always recomputed for their logits
        # exact mode re-runs the last prefix token with the first new one: through the main graph
        # both ways, so the prefill graph stops short of it (the main graph pairs it with the one before)
        split = n - 1 if self._prefill is not None and self.min_step_tokens == 2 else n
        logits = None
        while self.length < split:
            stop = min(split, self.length + self.max_step_tokens)
            stop = stop if stop == n else min(stop, n - rows)  # the last `rows` ids share the last call
            logits = self._forward(prefix[self.length:stop], rows if stop == n else 1, self._prefill or self._main)
        if self.length < n:
            logits = self._forward(prefix[n - 1:], 1, self._main)
        return logits

    def _run(self, ids: np.ndarray, rows: int, b: "_Binding | None" = None) -> np.ndarray:
        b = b or self._main
        T, L = len(ids), self.length
        if T == 0:
            raise ValueError(f"{self.name}: forward needs at least one token")
        if T > self.max_step_tokens:
            raise ValueError(f"{self.name}: {T} tokens in one step exceed max_step_tokens={self.max_step_tokens}")
        if L + T > self.max_context:
            raise ValueError(f"{self.name}: context {L}+{T} exceeds max_context={self.max_context}")
        assert 1 <= rows <= T, (rows, T)
        if rows > self.max_rows:
            raise ValueError(f"{self.name}: {rows} rows of logits in one step exceed max_rows={self.max_rows}")
        self._ids[:T] = ids
        self._call(T, L, rows, b)
        self._bound = (T, rows)
        self.calls += 1
        self.tokens[L:L + T] = ids
        self.length = L + T
        return self._logits[: rows * self.vocab].reshape(rows, self.vocab)  # [rows, vocab]

    def _call(self, T: int, L: int, rows: int, b: "_Binding") -> None:
        """Run `b`'s session on the ids in `self._ids[:T]` after L cached positions, reading `rows`."""
        if (T, rows) != b.bound:
            b.select((T, rows), self._bind_shape(T, rows))
        pad = int(T == 1) if self._pad_input else self._pad  # only a lone row needs the pad
        self._pad_rows[0] = pad
        self._seqlens[0] = L + T - 1 + pad
        self._total[()] = L + T + pad
        self._guesses[()] = rows - 1
        b.run()
        b.calls += 1

    @property
    def accepted(self) -> int:
        """How many of the last call's guesses (its last rows - 1 ids) the graph accepted."""
        assert self.draft_heads, f"{self.name} has no draft heads"
        return int(self._accepted[0])

    @property
    def next_token(self) -> int:
        """The target's own token after the last call's accepted guesses: the argmax of row `accepted`."""
        n = self.accepted
        return int(np.argmax(self._logits[n * self.vocab:(n + 1) * self.vocab]))

    @property
    def head_ids(self) -> np.ndarray:
        """The draft heads' guesses [K] of the last call, at its accepted row (the K tokens after
        the one that row's logits predict). A view, valid until the next call."""
        assert self.draft_heads, f"{self.name} has no draft heads"
        assert self._heads_on, f"{self.name}: the heads are off (use_heads(True) before the call)"
        return self._heads[: self.draft_heads]

    @property
    def row_probs(self) -> np.ndarray | None:
        """Each row's largest softmax probability [rows] of the last call (the graph's `probs`), or
        None for a graph without that output. A view, valid until the next call."""
        return self._probs[: self._bound[1]] if self._has_probs else None

    def exact_rows(self, probes: int = 3) -> bool:
        """Does a one-token pass give bit for bit the logits the same token gets inside a
        multi-token pass, on this machine? (Which kernels ONNX Runtime picks depends on the graph
        and the CPU.) If not, run the session with min_step_tokens=2. A few calls; resets the cache."""
        rng = np.random.default_rng(0)
        try:
            for _ in range(probes):
                ids = rng.integers(0, self.vocab, min(6, self.max_context))
                n = len(ids) // 2
                self.reset()
                self._run(ids[:n], 1)
                singles = [self._run(ids[i:i + 1], 1)[0].copy() for i in range(n, len(ids))]
                self.reset()
                self._run(ids[:n], 1)
                rest = ids[n:]
                if not np.array_equal(self._run(rest, len(rest)), np.stack(singles)):
                    return False
            return True
        finally:
            self.reset()

    @property
    def prefill_calls(self) -> int:
        """Calls run through the prefill graph (0 without one)."""
        return self._prefill.calls if self._prefill is not None else 0

    def __repr__(self) -> str:
        return (f"FusedDecoderSession({self.name}: {self.n_layers} layers, {self.n_heads}x{self.head_dim} kv, "
                f"vocab {self.vocab}, context {self.length}/{self.max_context})")


class _Binding:
    """One ONNX Runtime session of a FusedDecoderSession with an IO binding per call shape (T, rows):
    binding input_ids / logits / probs anew whenever the shape changed cost ~19 µs a call on grasp
    (a decision's prefill and its verify passes of 5, 3, ... rows alternate), selecting a binding
    made before costs nothing. `bound` is the shape `run` is bound for; `bind_static(binding,
    bind_in, bind_out)` binds what every shape shares (the KV cache, the scalars)."""

    MAX_SHAPES = 64  # prefills of varying length: the least recently used is dropped past this

    def __init__(self, session: ort.InferenceSession, bind_static):
        self.session = session
        self.inputs = {i.name for i in session.get_inputs()}
        self._bind_static = bind_static
        self._shapes: dict[tuple[int, int], tuple] = {}  # (T, rows) -> (IOBinding, run)
        self.run = None
        self.bound = (0, 0)
        self.calls = 0

    def select(self, shape: tuple[int, int], bind_shape) -> None:
        """Make `run` the binding for `shape`, made on first use with `bind_shape(bind_in, bind_out)`."""
        entry = self._shapes.pop(shape, None)  # re-inserted last: the dict's order is least recently used first
        if entry is None:
            if len(self._shapes) >= self.MAX_SHAPES:
                del self._shapes[next(iter(self._shapes))]
            io = self.session.io_binding()
            bind_in, bind_out, run = _fast_binding(self.session, io)
            self._bind_static(self, bind_in, bind_out)
            bind_shape(bind_in, bind_out)
            entry = (io, run)  # the IOBinding stays alive with its run
        self._shapes[shape] = entry
        self.run = entry[1]
        self.bound = shape
