"""Pretrained language models: GGUF import (numpy, no torch) into `LlamaWeights`, the tokenizer a
GGUF describes, a numpy reference forward, and the model cache (`make lm-model`). See docs/LM.md."""
