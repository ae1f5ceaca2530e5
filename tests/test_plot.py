"""plot_run: the learning curve in any format matplotlib writes; rows without a step, an unknown extension
or a missing folder are one sentence each, and nothing is written."""

import json

import pytest

from ctrl_rl.errors import UserInputError
from ctrl_rl.plot import plot_run


def write_run(d, rows):
    d.mkdir(parents=True, exist_ok=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


ROWS = [{"step": 100 * i, "wall_time": 1.0 * i, "episode_return": -100.0 + i, "loss/critic": 0.5} for i in range(1, 6)]


def files(d):
    return sorted(p.name for p in d.rglob("*"))


@pytest.mark.parametrize("name", ["curve.png", "curve.pdf", "curve.svg", "CURVE.PNG"])
def test_plot_writes_the_format_of_the_extension(tmp_path, name):
    d = write_run(tmp_path / "run", ROWS)
    out = plot_run(d, tmp_path / name)
    assert out == tmp_path / name
    head = out.read_bytes()[:8]
    assert {"png": head.startswith(b"\x89PNG"), "pdf": head.startswith(b"%PDF"),
            "svg": b"<?xml" in head}[name.lower().rsplit(".", 1)[1]]
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]


def test_plot_default_is_learning_curve_png_and_rows_without_return_are_fine(tmp_path):
    d = write_run(tmp_path / "run", [{"step": 1, "loss/critic": 1.0}, *ROWS, {"step": 600, "episode_return": None}])
    assert plot_run(d) == d / "learning_curve.png" and (d / "learning_curve.png").stat().st_size > 1000


def test_plot_of_a_run_without_finished_episodes(tmp_path):
    d = write_run(tmp_path / "run", [{"step": 1, "wall_time": 0.1}])
    assert plot_run(d).is_file()


def refused(d, out, *fragments):
    before = files(d.parent)
    with pytest.raises(UserInputError) as e:
        plot_run(d, out)
    msg = str(e.value)
    assert "\n" not in msg and "expected" in msg, msg
    for f in fragments:
        assert f in msg, msg
    assert files(d.parent) == before  # nothing written
    return msg


def test_rows_without_step_are_one_sentence(tmp_path):
    d = write_run(tmp_path / "run", [*ROWS, {"wall_time": 9.0, "episode_return": 3.0}])
    refused(d, None, "row 6", "'step'", "metrics.jsonl")
    write_run(d, [{"step": "ten", "wall_time": 1.0, "episode_return": 1.0}])
    refused(d, None, "row 1", "'step'")
    write_run(d, [{"step": 10, "episode_return": 1.0}])
    refused(d, None, "'wall_time'")
    write_run(d, [{"step": 10, "wall_time": 1.0, "episode_return": "high"}])
    refused(d, None, "'episode_return'")


@pytest.mark.parametrize("name", ["curve.txt", "curve", "curve.png.bak"])
def test_unknown_extension_is_one_sentence(tmp_path, name):
    d = write_run(tmp_path / "run", ROWS)
    msg = refused(d, tmp_path / name, ".png", ".pdf", ".svg")
    assert ("no file extension" in msg) if "." not in name else (repr("." + name.rsplit(".", 1)[1]) in msg)


def test_missing_folder_or_directory_is_one_sentence(tmp_path):
    d = write_run(tmp_path / "run", ROWS)
    refused(d, tmp_path / "nowhere" / "c.png", "does not exist", "nowhere")
    (tmp_path / "dir.png").mkdir()
    refused(d, tmp_path / "dir.png", "is a directory")


def test_run_without_metrics_is_one_sentence(tmp_path):
    with pytest.raises(UserInputError, match="no metrics.jsonl"):
        plot_run(tmp_path)
