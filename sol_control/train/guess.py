"""A bundle's answer guesser (`target.guesses`, decoding.guesses) fitted on training prefixes (numpy)."""
from __future__ import annotations

import numpy as np

GUESSES = "guesses.npz"
# answer tokens the prefill guesses (sol_control.decoding.guesses), per task, learnt from the fast
# target's own greedy answers to training observations. QC: the whole answer but the severity, which
# the last checked row then decides itself. Grasp: 6 of 15 tokens (its 5th, the width, is guessed
# right ~45 % of the time, so later guesses pay little: 6 / 8 / 14 positions gave 3.45 / 3.44 / 2.85
# calls a decision but the same ms, 1.70 / 1.69 / 1.73; none 4.40 calls, 2.05 ms)
GUESS_POSITIONS = {"qc": 3, "grasp": 6}


def write_guesses(bundle, prefixes: list[np.ndarray], positions: int, precision: str = "int8") -> dict:
    """Fit the guesser of the answer's first `positions` tokens on the `precision` target's own
    greedy answers to `prefixes` (training prefixes only) and write it into the bundle folder as
    guesses.npz; the manifest must list it afterwards (`target.guesses`, sha256). A record for
    the manifest's metrics."""
    from sol_control.decoding import greedy, open_decoder
    from sol_control.decoding.guesses import fit_guesser

    target = open_decoder(bundle, "target", precision)
    answers = []
    for p in prefixes:
        answers.append(greedy(target, p, positions).tokens)
        target.reset()
    guesser = fit_guesser(prefixes, np.array(answers), bundle.manifest.vocab.size, positions)
    guesser.save(bundle.root / GUESSES)
    right = [guesser.guess(p) == a for p, a in zip(prefixes[:500], answers[:500])]
    return {"positions": positions, "train_scenes": len(prefixes), "train_all_right": round(float(np.mean(right)), 3)}
