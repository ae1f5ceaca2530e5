"""What reading an export needs, without torch: ``policy.json`` checked enough to run (``read_export``) and an
onnxruntime session (``onnx_session``). The policy server and the deploy runtime import only this module, so a
server (re)starts in the time onnxruntime takes, not torch's (``deploy/export.py`` writes exports and needs torch).
"""

from __future__ import annotations

import json
from pathlib import Path

from ctrl_rl.errors import UserInputError

FORMAT_VERSION = 1
"""``policy.json``'s ``format_version``: a reader refuses any other."""


def onnx_session(path: str | Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])



def read_export(directory: str | Path) -> dict:
    """``policy.json`` of an export directory, checked enough to run: one sentence when it is not an export."""
    d = Path(directory)
    f = d / "policy.json"
    if not f.is_file():
        raise UserInputError(f"{str(d)!r} has no policy.json: expected a directory written by `ctrl-rl export`")
    try:
        meta = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise UserInputError(f"{str(f)!r} is not valid JSON ({e}): "
                             "expected the sidecar `ctrl-rl export` writes") from None
    if not isinstance(meta, dict) or meta.get("format") != "ctrl_rl.export":
        raise UserInputError(f"{str(f)!r} is not a ctrl_rl export sidecar: expected \"format\": \"ctrl_rl.export\"")
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserInputError(f"{str(f)!r} has export format version {meta.get('format_version')!r}: expected "
                             f"{FORMAT_VERSION} (re-export the run with this ctrl_rl)")
    for key in ("inputs", "outputs", "action", "files"):
        if key not in meta:
            raise UserInputError(f"{str(f)!r} lacks {key!r}: expected the fields `ctrl-rl export` writes")
    return meta
