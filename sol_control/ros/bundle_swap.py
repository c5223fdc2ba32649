"""A new bundle onto a running line, without a restart: `qc.bundle` / `grasp.bundle` set on a
configured node switch that task to the bundle in the folder given.

    parameter set (executor thread) ─► Coprocessor.load_pipeline: manifest, sha256 of every file,
        sessions, the activation warm-up (beside the running pipeline, which keeps deciding)
    ─► TaskRunner.at_boundary: Coprocessor.replace_pipeline between two frames (one reference swap)
    ─► the old pipeline is closed; the parameter set returns successful

A bundle that fails verification, is for another task, or fails its warm-up is refused: the
parameter set fails with the reason and the old bundle keeps deciding. Setting the parameter to the
bundle already deciding (same folder, same manifest sha256) does nothing; the same folder with a
rewritten manifest is loaded again. While unconfigured, the parameter applies at configure.
The runner's worker never waits for a load; the executor thread does (no timers, no other
parameter or lifecycle request runs meanwhile, so none can release the sessions under the load).

`python -m sol_control.ros.bundle_swap --value DIR [--param qc.bundle] [--node /sol_control]
[--wait-stdin]` asks a running node for a swap through its set_parameters service, the way
`ros2 param set` does, and prints {"successful", "reason", "sent_ns", "done_ns"} as one JSON line
(system clock, the clock images are stamped with); `sol-control bench node --swap-at` uses it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import rclpy
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters

from sol_control.decision import Decision

SWAP_PARAMS = {"qc.bundle": "qc", "grasp.bundle": "grasp"}  # parameter -> the task it swaps
BOUNDARY_TIMEOUT_S = 10.0  # a worker stalled longer than this in one decision: the swap is refused


def named(d: Decision, cop) -> Decision:
    """`d` with the sha256 of the bundle deciding its task when nothing named one (the runner's own
    answers: watchdog, sensor timeout, errors). Swaps happen between a runner's frames, so that is
    the bundle the answered frame was being decided on."""
    if d.bundle_sha256 or cop is None:
        return d
    return replace(d, bundle_sha256=cop.bundle_sha256(d.task))


class BundleSwaps:
    """Swaps bundles on a configured node and counts them per task (on /diagnostics)."""

    def __init__(self, logger):
        self._log = logger
        self.swaps: Counter[str] = Counter()
        self.refused: Counter[str] = Counter()
        self.last_refusal: dict[str, str] = {}
        self.last_swap_s: dict[str, float] = {}  # load + verify + warm-up + install, seconds

    def apply(self, cop, runners: dict, changes: dict, cfg) -> str:
        """Swap every configured task whose bundle parameter is in `changes` to `cfg.bundle_dir(task)`.
        All new bundles are loaded and warmed before any is installed. Returns "" when every swap is
        done (or none was needed), else why none was (or which were done before one failed)."""
        loaded: list = []  # (task, pipeline, load start)
        for task in [t for name, t in SWAP_PARAMS.items() if name in changes and t in cop.tasks]:
            bundle_dir, t0 = cfg.bundle_dir(task), time.perf_counter()
            try:
                if not self.deciding(cop, task, bundle_dir):
                    loaded.append((task, cop.load_pipeline(task, bundle_dir), t0))
            except Exception as e:  # noqa: BLE001 - any load failure refuses the bundle, never the node
                for _, p, _ in loaded:
                    p.close()
                return self._refuse(task, f"{task}.bundle {bundle_dir} refused, {task} keeps deciding on "
                                          f"{_short(cop.bundle_sha256(task))}: {e}")
        for i, (task, p, t0) in enumerate(loaded):
            if not self._install(cop, runners.get(task), task, p):
                for _, q, _ in loaded[i:]:
                    q.close()
                done = "".join(f", {t} already swapped" for t, _, _ in loaded[:i])
                return self._refuse(task, f"{task}.bundle {p.bundle.root} refused: the {task} worker reached no "
                                          f"frame boundary within {BOUNDARY_TIMEOUT_S:.0f} s{done}")
            self.swaps[task] += 1
            self.last_swap_s[task] = time.perf_counter() - t0
            self._log.info(f"{task}: bundle {p.bundle.root} (manifest sha256 {_short(p.bundle_sha256)}) "
                           f"deciding; loaded, verified and warmed in {self.last_swap_s[task]:.2f} s")
        return ""

    @staticmethod
    def deciding(cop, task: str, bundle_dir) -> bool:
        """Whether the bundle in `bundle_dir` is the one deciding `task` (same folder, same manifest)."""
        from sol_control.coprocessor import manifest_sha256  # loaded with the coprocessor, at configure

        running = cop.pipelines[task]
        return (Path(bundle_dir).resolve() == running.bundle.root
                and manifest_sha256(bundle_dir) == running.bundle_sha256)

    def key_values(self, task: str) -> dict[str, object]:
        kv: dict[str, object] = {"bundle_swaps": self.swaps[task], "bundle_swaps_refused": self.refused[task]}
        if task in self.last_swap_s:
            kv["bundle_swap_last_s"] = self.last_swap_s[task]
        if task in self.last_refusal:
            kv["bundle_swap_last_refusal"] = self.last_refusal[task]
        return kv

    def _install(self, cop, runner, task: str, p) -> bool:
        """Install `p` between two of the runner's frames and close the pipeline it replaced."""
        old = []
        if runner is None:
            old.append(cop.replace_pipeline(task, p))
        elif not runner.at_boundary(lambda: old.append(cop.replace_pipeline(task, p)), BOUNDARY_TIMEOUT_S):
            return False
        for o in old:  # no frame runs on it any more; a running audit of it ends here
            o.close()
        return bool(old)

    def _refuse(self, task: str, why: str) -> str:
        self.refused[task] += 1
        self.last_refusal[task] = why
        self._log.error(why)
        return why


def _short(sha256: str) -> str:
    return sha256[:12] or "none"


# -- the client: ask a running node for a swap ----------------------------------------------------
def swap_client(node, target: str, timeout_s: float):
    """A client of the set_parameters service of the node named `target`; None if it never shows."""
    cli = node.create_client(SetParameters, f"{target}/set_parameters")
    return cli if cli.wait_for_service(timeout_sec=timeout_s) else None


def request_swap(node, cli, param: str, value: str, timeout_s: float) -> dict:
    """Set `param` to `value` and wait for the answer: {"successful", "reason", "sent_ns", "done_ns"}."""
    request = SetParameters.Request(parameters=[Parameter(
        name=param, value=ParameterValue(type=ParameterType.PARAMETER_STRING, string_value=value))])
    sent_ns = time.time_ns()
    future = cli.call_async(request)
    rclpy.spin_until_future_complete(node, future, timeout_sec=timeout_s)
    done_ns = time.time_ns()
    if not future.done() or future.result() is None:
        return {"successful": False, "reason": f"no answer within {timeout_s:.0f} s", "sent_ns": sent_ns,
                "done_ns": done_ns}
    result = future.result().results[0]
    return {"successful": bool(result.successful), "reason": result.reason, "sent_ns": sent_ns, "done_ns": done_ns}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="ask a running sol_control node to swap a task's bundle")
    ap.add_argument("--value", required=True, help="the new bundle folder")
    ap.add_argument("--param", choices=sorted(SWAP_PARAMS), default="qc.bundle")
    ap.add_argument("--node", default="/sol_control", help="the node's full name")
    ap.add_argument("--timeout-s", type=float, default=120.0)
    ap.add_argument("--wait-stdin", action="store_true",
                    help="print 'ready' once the service is there, send on the next line of stdin")
    args = ap.parse_args(argv)
    rclpy.init()
    node = rclpy.create_node("sol_control_bundle_swap")
    try:
        cli = swap_client(node, args.node, args.timeout_s)
        if cli is None:
            out = {"successful": False, "reason": f"no service {args.node}/set_parameters", "sent_ns": 0, "done_ns": 0}
        else:
            if args.wait_stdin:
                print("ready", flush=True)
                sys.stdin.readline()
            out = request_swap(node, cli, args.param, args.value, args.timeout_s)
        print(json.dumps(out), flush=True)
        return 0 if out["successful"] else 1
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
