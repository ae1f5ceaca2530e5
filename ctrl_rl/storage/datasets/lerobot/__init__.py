"""LeRobot datasets (v3.0 written; v3.0 and v2.x read) with pyarrow and PyAV, without the ``lerobot`` package.

The modules point one way; none imports a later one (``tests/storage/test_lerobot_layers.py`` holds the order)::

    layout.py   paths, versions, index features, feature specs and their Arrow types; reads and writes nothing
    robot.py    the robot a ``robot_type`` names and the action keys that feed each of its action spaces (DROID's
                port: ``action.cartesian_velocity`` + ``action.gripper_velocity``, ...); reads nothing
    video.py    PyAV: encode episodes into one mp4 (``VideoFileWriter``), decode an episode's frames
    reader.py   ``read_lerobot`` -> ``LeRobotData`` (metadata checked against the files, frames per episode),
                ``lerobot_info``, ``episode_success``, ``to_offline_dataset`` / ``load_lerobot``   [layout, video,
                robot]
    writer.py   ``LeRobotWriter`` (atomic v3.0 writer with LeRobot's statistics), ``droid_features``  [layout, video]

The reader and the writer do not import each other. This package re-exports the names callers use.
"""

from ctrl_rl.storage.datasets.lerobot.reader import (
    LeRobotData,
    episode_success,
    lerobot_info,
    load_lerobot,
    read_lerobot,
    success_rate,
    to_offline_dataset,
)
from ctrl_rl.storage.datasets.lerobot.video import pick_encoder
from ctrl_rl.storage.datasets.lerobot.writer import LeRobotWriter, droid_features

__all__ = [
    "LeRobotData", "LeRobotWriter", "droid_features", "episode_success", "lerobot_info", "load_lerobot",
    "pick_encoder", "read_lerobot", "success_rate", "to_offline_dataset",
]
