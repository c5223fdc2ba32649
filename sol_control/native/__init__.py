"""The native pass's C source (`fused_pass.c`, `walk.h`, `kernels_*.c`, `dispatch.c`), its
variants (`isa.py`) and its build (`build.py`); loaded by `sol_control.decoding.native`."""
