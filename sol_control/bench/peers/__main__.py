"""`python -m sol_control.bench.peers SPEC OUT`: one step of a peer row in its engine's venv
(`common.worker`); the peer runners start it."""
import sys
from pathlib import Path

from .common import worker

worker(Path(sys.argv[1]), Path(sys.argv[2]))
