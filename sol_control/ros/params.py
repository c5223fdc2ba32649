"""A typed config as ROS parameters: declared with descriptors (type, description, range), read back
through the config's own validation. The coprocessor node and the simulated cell both use it."""
from __future__ import annotations

from pydantic import BaseModel
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.node import Node

from sol_control import params


def descriptor(spec: params.ParamSpec) -> ParameterDescriptor:
    desc = spec.description + (f" {spec.range_text}" if spec.range_text else "")
    d = ParameterDescriptor(name=spec.name, description=desc)
    if spec.kind is float and spec.low is not None and spec.high is not None:
        d.floating_point_range = [FloatingPointRange(from_value=float(spec.low), to_value=float(spec.high), step=0.0)]
    elif spec.kind is int and spec.low is not None and spec.high is not None:
        d.integer_range = [IntegerRange(from_value=int(spec.low), to_value=int(spec.high), step=1)]
    if spec.choices:
        d.additional_constraints = "one of: " + ", ".join(spec.choices)
    return d


def declare_config(node: Node, model: type[BaseModel], what: str) -> tuple[BaseModel, str]:
    """Declare every field of `model` on `node` and build the config from the values given (launch
    overrides, params files). Returns (config, errors): on any bad value the defaults and a
    message naming each bad field and value ("" when all is well)."""
    errors = []
    specs = params.param_specs(model)
    for spec in specs:
        desc = descriptor(spec)
        try:
            node.declare_parameter(spec.name, spec.default, desc)
        except Exception as e:  # noqa: BLE001 - a bad override: keep the default, report it
            node.declare_parameter(spec.name, spec.default, desc, ignore_override=True)
            errors.append(f"{spec.name}: {e}")
    try:
        cfg = params.from_flat(model, {s.name: node.get_parameter(s.name).value for s in specs}, what=what)
    except ValueError as e:
        cfg = model()
        errors.append(str(e))
    return cfg, "; ".join(errors)
