"""The native pass's C source (`fused_pass.c`) and its build (`build.py`); loaded by
`sol_control.decoding.native`."""
