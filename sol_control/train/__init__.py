"""`sol-control train`: a user's labelled images -> a verified bundle (dev-side; torch).

tasks/labelled_folder.py (read and check the folder, torch-free) -> data.py (token arrays, split) -> loop.py
(training, checkpoints) with heads.py (draft heads) -> export.py (ONNX: Optimum fp32, fused fp32 /
int8 / int4) -> pipeline.py (validation, the quantization check, the bundle) -> report.py.
layout.py and model.py are shared with tools/ (`make models`). The node never imports this package
(tests/test_layering.py); this file imports nothing, so `cli` builds the train command's parser without torch.
"""
