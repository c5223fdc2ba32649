"""One recorded QC line (`sol-control demo --record`) as `sol-control lines` plays and scores it:
its messages on the shared timeline and the ground truth per image stamp. ROS-free: the player
(`line_player`, rclpy) fills it from a bag, the scorer (`lines`) reads it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

QC_TOPICS = ("qc/camera/image_raw", "conveyor/joint_states")
TRUTH_TOPIC = "sim/truth"


@dataclass
class LineBag:
    """One line's recorded QC station: timed messages to publish and the truth per image stamp."""

    name: str                                        # "line1": the namespace without its slash
    messages: list[tuple[int, str, object]]          # (sim time ns, relative topic, rclpy message)
    defective: dict[int, bool] = field(default_factory=dict)

    @property
    def frame_id(self) -> str:
        return f"{self.name}/qc_camera"

    @property
    def image_stamps(self) -> set[int]:
        return {t for t, topic, _ in self.messages if topic == QC_TOPICS[0]}
