"""What a decoder is: the interface `greedy`, `speculate`, `speculate_heads`, the planners and the
benchmarks are written against. Three session classes have it: `DecoderSession` (the Optimum
decoder-with-past layout on ONNX Runtime), `FusedDecoderSession` (the fused layout, with or without
draft heads) and `NativeDecoderSession` (the fused layout run by the C pass); `factory.open_decoder`
opens the one a bundle's decoder needs.

    prefill(prefix [P]) -> logits [vocab]   the cache holds `prefix` (its cached leading part reused)
    forward(ids [T]) -> logits [T, vocab]   `ids` appended to the cache; a view, valid until the next call
    rewind(n_keep), reset()                 forget cached positions (an index moves; nothing is allocated)

A decoder with draft heads (`draft_heads` = K > 0) checks, in the same pass, the guesses it was fed
after the current token: after a call `accepted` of them were right, `next_token` is its own token
after those, and `head_ids` [K] is what its heads guess follows. Without heads these three are never
read. `row_probs` is each returned row's largest softmax probability when the graph computes it
(None: the caller takes a softmax of the logits).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from .guesses import AnswerGuesser


class Decoder(Protocol):
    name: str
    vocab: int
    max_context: int  # KV cache positions
    length: int  # cached positions now
    calls: int  # forward passes run
    draft_heads: int  # K guesses a call (0: no heads)
    guesser: AnswerGuesser | None  # the bundle's answer guesser, for `prefill_guessed`
    backend_info: dict | None  # which backend runs it and why (factory.open_decoder); None when opened directly

    def reset(self) -> None: ...

    def rewind(self, n_keep: int) -> None: ...

    def use_heads(self, on: bool, last: bool = False) -> None:
        """Run the draft heads in the next calls or not; `last`: the next calls may end the answer."""

    def prefill(self, prefix: np.ndarray) -> np.ndarray: ...

    def forward(self, ids: np.ndarray) -> np.ndarray: ...

    @property
    def can_guess_prefill(self) -> bool:
        """Can `prefill_guessed` run on this decoder."""

    def prefill_guessed(self, ids: np.ndarray, guesses: int) -> np.ndarray:
        """`prefill` of `ids` whose last `guesses` ids are checked like a verify pass: their logits
        [guesses + 1, vocab]."""

    @property
    def row_probs(self) -> np.ndarray | None: ...

    @property
    def accepted(self) -> int: ...

    @property
    def next_token(self) -> int: ...

    @property
    def head_ids(self) -> np.ndarray: ...
