"""`python -m sol_control.bench.peers`: see the package docstring."""
import sys

from . import main

sys.exit(main())
