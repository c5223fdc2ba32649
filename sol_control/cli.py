"""`sol-control ...`: benchmarks, evaluation, the demo, bundle inspection.

Each subcommand imports its module lazily, so `sol-control bundle` does not load rclpy or MuJoCo.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, help). Each module exposes `add_arguments(parser)` and `run(args) -> int`.
COMMANDS = {
    "bundle": ("sol_control.bench.bundle_info", "verify a model bundle (sha256, signature) and describe it"),
    "eval": ("sol_control.eval", "accuracy of a bundle on the test or held-out split, per precision"),
    "demo": ("sol_control.sim.demo", "run the simulated cell with the coprocessor (the main job)"),
    "replay": ("sol_control.sim.replay", "feed a recorded MCAP bag through the coprocessor offline"),
    "lines": ("sol_control.sim.lines", "several QC lines on one ROS graph (namespaces), fed from recorded bags"),
    "soak": ("sol_control.bench.soak", "long run at 3x the nominal rate: memory, misses, p99"),
    "import": ("sol_control.lm.importer", "a GGUF, Hugging Face or ONNX model -> a verified LM bundle"),
    "generate": ("sol_control.lm.generate", "greedy text from a language model bundle (speculative with a draft)"),
    "doctor": ("sol_control.doctor", "this PC: CPU, kernels, ms per decision per bundle and precision, do the deadlines hold"),
    "parts": ("sol_control.tasks.parts", "generated QC parts as a labelled image folder (good/, defect/<kind>/): a stand-in for your own"),
    "train": ("sol_control.train.command", "a QC bundle from your own labelled images (good/, defect/<kind>/): fine-tune, export, check"),
}
BENCHES = {
    "decode": ("sol_control.bench.decode_bench", "decoder: standard vs quantized vs speculative"),
    "node": ("sol_control.bench.node_bench", "ROS node: stamp-to-receipt latency over DDS"),
    "cold-start": ("sol_control.bench.cold_start", "ROS node: process start to first decision, where the time goes"),
    "lm": ("sol_control.bench.lm_bench", "a real LM (SmolLM2-135M): standard vs quantized vs speculative, agent loop"),
    "all": ("sol_control.bench.report", "everything, into bench_report/"),
}


def _add(sub, name: str, module: str, help_: str) -> None:
    p = sub.add_parser(name, help=help_, description=help_)
    p.set_defaults(_module=module)
    try:
        importlib.import_module(module).add_arguments(p)
    except ModuleNotFoundError as e:  # a part of the package that is not installed (or not yet built)
        p.set_defaults(_missing=str(e))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sol-control", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, help_) in COMMANDS.items():
        _add(sub, name, module, help_)
    bench = sub.add_parser("bench", help="benchmarks (decode, node, all)")
    bsub = bench.add_subparsers(dest="bench", required=True)
    for name, (module, help_) in BENCHES.items():
        _add(bsub, name, module, help_)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "_missing", None):
        print(f"sol-control: this command is not available: {args._missing}", file=sys.stderr)
        return 2
    try:
        return int(importlib.import_module(args._module).run(args) or 0)
    except ValueError as e:  # configuration and bundle errors: one clear line, no traceback
        print(f"sol-control: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
