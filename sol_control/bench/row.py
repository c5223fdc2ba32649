"""A row of a benchmark table: one configuration (target precision, how it decodes) with sessions
of its own, so warm caches stay per row. The decision bench (`decode_bench`) and the LM bench
(`lm_rows`) each add what they record."""
from __future__ import annotations

from dataclasses import dataclass

from ..decoding import AdaptiveK, GuessLength, greedy, open_decoder, speculate, speculate_heads

def draft_precision(manifest) -> str:
    """The draft model's precision the rows run: int8 where there is one."""
    return "int8" if "int8" in manifest.draft.precisions else manifest.draft.precisions[0]


@dataclass
class Row:
    name: str
    precision: str
    mode: str  # plain | heads | draft | lookup (prompt lookup alone, on a target without heads)
    target: object = None
    draft: object = None
    controller: AdaptiveK | None = None
    length: GuessLength | None = None  # heads / lookup rows: guesses a pass checks, learnt across answers
    lookup: int = 0  # heads / lookup rows: prompt-lookup guesses where the text repeats

    @property
    def speculative(self) -> bool:
        return self.mode != "plain"

    def open_draft(self, bundle, threads: int, name: str) -> None:
        """The bundle's draft model beside the target, its length adapted per pass."""
        self.draft = open_decoder(bundle, "draft", draft_precision(bundle.manifest), threads, name=name)
        self.controller = AdaptiveK()

    def reset(self) -> None:
        """Empty the caches: the next answer starts cold."""
        self.target.reset()
        if self.draft is not None:
            self.draft.reset()

    def decode(self, prefix, max_new: int, stops: tuple[int, ...] = (), k: int | None = None, cold: bool = False):
        """One answer after `prefix` (the caches emptied first when `cold`): greedy, the target's
        draft heads (with prompt lookup), or the draft model."""
        if cold:
            self.reset()
        if self.mode == "plain":
            return greedy(self.target, prefix, max_new, stop_ids=stops)
        if self.mode in ("heads", "lookup"):
            return speculate_heads(self.target, prefix, max_new, stop_ids=stops, lookup=self.lookup,
                                   length=self.length)
        return speculate(self.draft, self.target, prefix, max_new, k=k, controller=self.controller, stop_ids=stops)
