"""The native pass's C source (`fused_int8.c`) and its build (`build.py`); loaded by
`sol_control.decoding.native`."""
