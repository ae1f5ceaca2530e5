"""LeRobot datasets through the common entry points: `ctrl-rl data info DIR` and `load_dataset(DIR)`."""

import json
from pathlib import Path

import pytest

from ctrl_rl.cli import main
from ctrl_rl.errors import UserInputError
from ctrl_rl.storage.datasets.loader import dataset_fingerprint

pytest.importorskip("pyarrow")
pytest.importorskip("av")
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize("name,version,episodes,frames,success", [("lerobot_v30_reference", "v3.0", 3, 19, 2 / 3),
                                                                   ("lerobot_v21_tiny", "v2.1", 2, 10, None)])
def test_data_info_summarises_a_lerobot_directory(name, version, episodes, frames, success, capsys):
    assert main(["data", "info", str(FIXTURES / name)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["format"] == "lerobot" and info["codebase_version"] == version
    assert (info["episodes"], info["frames"]) == (episodes, frames) and info["success_rate"] == success
    assert len(info["instructions"]) == 2 and info["cameras"]
    assert info["sha256"] == dataset_fingerprint(FIXTURES / name)["sha256"]


def test_load_dataset_reads_a_lerobot_directory_and_refuses_the_d4rl_view():
    from ctrl_rl.storage.datasets import load_dataset

    ds = load_dataset(FIXTURES / "lerobot_v30_reference")
    assert (len(ds), ds.obs_dim, ds.action_dim, ds.num_episodes) == (19, 4, 3, 3)
    with pytest.raises(UserInputError, match="trajectory view"):
        load_dataset(FIXTURES / "lerobot_v30_reference", view="qlearning")
    with pytest.raises(UserInputError, match="observations of dim 4: expected 5"):
        load_dataset(FIXTURES / "lerobot_v30_reference", obs_dim=5)


def test_a_directory_that_is_no_dataset_names_the_layouts(tmp_path, capsys):
    assert main(["data", "info", str(tmp_path)]) == 2
    assert "meta/info.json" in capsys.readouterr().err
