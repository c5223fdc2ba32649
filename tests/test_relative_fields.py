"""Action fields relative to an observation feature (grasp width = the measured extent + a margin)."""
import numpy as np
import pytest
from pydantic import ValidationError

from sol_control.actions import ActionTokenizer, feature_bin_centre
from sol_control.bundle import ActionField
from sol_control.perception import ObservationTokenizer
from sol_control.tasks import grasp
from sol_control.tasks.common import BOS, GRASP_FIELDS, GRASP_RELATIVE, SEP
from sol_control.train.layout import action_tokenizer, layout


@pytest.fixture(scope="module")
def grasp_layout():
    lay = layout("grasp")
    return (action_tokenizer("grasp"), ObservationTokenizer(lay["observation"], BOS, SEP),
            {s["name"]: s for s in lay["observation"]["features"]})


def _minor_token(prefix: np.ndarray, spec: dict) -> int:
    (tok,) = [int(t) for t in prefix if spec["offset"] <= t < spec["offset"] + spec["size"]]
    return tok - spec["offset"]


def test_the_width_token_is_the_margin_over_the_measured_extent(grasp_layout):
    acts, obs, specs = grasp_layout
    width = acts.fields[GRASP_FIELDS.index("width")]
    assert width.relative_to == GRASP_RELATIVE["width"][0] == "minor_m"
    s = grasp.make_sample("test", 3)
    prefix = obs.encode(s.image, s.joints_rad)
    tokens = acts.encode(s.label, prefix)
    base = feature_bin_centre(specs["minor_m"], _minor_token(prefix, specs["minor_m"]))
    index = tokens[GRASP_FIELDS.index("width")] - width.token_offset
    assert index == int(np.floor((s.label["width"] - base - width.low) / (width.high - width.low) * width.size))
    decoded = acts.decode(tokens, prefix=prefix)
    assert abs(decoded.width_m - s.label["width"]) <= (width.high - width.low) / width.size / 2 + 1e-9


def test_an_object_wider_than_any_in_training_gets_a_width_token(grasp_layout):
    """The held-out split has objects wider than any training one: in absolute bins their width token
    was never a training target; relative to the extent it is the same margin as always."""
    acts, obs, _ = grasp_layout
    wi = GRASP_FIELDS.index("width")
    train = [grasp.make_sample("train", i) for i in range(30)]
    train_max = max(s.label["width"] for s in train)
    wide = grasp.make_sample("heldout", 82)  # a large cylinder
    assert wide.label["width"] > train_max + 0.006
    prefix = obs.encode(wide.image, wide.joints_rad)
    token = acts.encode(wide.label, prefix)[wi]
    train_tokens = {acts.encode(s.label, obs.encode(s.image, s.joints_rad))[wi] for s in train}
    assert min(train_tokens) - 8 <= token <= max(train_tokens) + 8  # a margin like the training ones
    assert acts.decode(acts.encode(wide.label, prefix), prefix=prefix).width_m == pytest.approx(
        wide.label["width"], abs=0.001)


def test_a_relative_field_without_its_prefix_is_refused(grasp_layout):
    acts, obs, specs = grasp_layout
    s = grasp.make_sample("test", 0)
    prefix = obs.encode(s.image, s.joints_rad)
    tokens = acts.encode(s.label, prefix)
    with pytest.raises(ValueError, match="relative to 'minor_m'"):
        acts.decode(tokens)
    with pytest.raises(ValueError, match="relative to 'minor_m'"):
        acts.encode(s.label)
    spec = specs["minor_m"]
    twice = np.append(prefix, spec["offset"] + _minor_token(prefix, spec))  # which one would it be?
    with pytest.raises(ValueError, match="got 2"):
        acts.decode(tokens, prefix=twice)


def test_relative_to_must_name_an_observation_feature_and_bins():
    f = ActionField(name="width", kind="bins", token_offset=10, size=4, low=-1.0, high=1.0, relative_to="nope")
    with pytest.raises(ValueError, match="'nope' is not an observation feature"):
        ActionTokenizer("grasp", (f,), features=({"name": "minor_m", "offset": 4, "size": 4, "low": 0.0,
                                                  "high": 1.0},))
    with pytest.raises(ValidationError, match="relative_to needs kind 'bins'"):
        ActionField(name="c", kind="categorical", token_offset=10, size=1, labels=("a",), relative_to="minor_m")


def test_feature_bin_centre_inverts_the_binning():
    from sol_control.perception import bin_feature

    for spec in ({"name": "a", "offset": 0, "size": 32, "low": 4e-4, "high": 8e-3, "scale": "log"},
                 {"name": "b", "offset": 0, "size": 256, "low": 0.0, "high": 0.128}):
        for i in (0, 7, spec["size"] - 1):
            assert bin_feature(feature_bin_centre(spec, i), spec) == i
