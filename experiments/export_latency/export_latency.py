"""Exported policy latency at batch 1: onnxruntime against torch eager, p50 / p99 (issue: robots, benchmark 1).

Two policies, built from configs with random weights (latency does not depend on training):

- ``mlp``: SAC's actor, 256x256 ReLU MLP, HalfCheetah's sizes (17 observations, 6 actions), with the export's
  action rescaling; target p99 <= 100 us in onnxruntime.
- ``image``: SAC with the DrQ encoder on one 3x84x84 uint8 camera plus a 7-dim state (4 convs of 32 channels,
  50 features), 256x256 actor: the encoder dominates.

Each is exported the way ``ctrl-rl export`` does (``ExportModule`` -> dynamo ONNX), then called ``--calls`` times
at batch 1 per repeat, after ``--warmup`` calls: onnxruntime (one intra-op thread, as the runtime uses it) with the
inputs as NumPy arrays, and the eager module under ``torch.inference_mode`` with one torch thread. Every call is
timed alone with ``perf_counter_ns``; the table gives the median over ``--repeats`` repeats of each repeat's
p50 and p99. Both run in this process, alternating per repeat, so load drifts hit both sides alike.

    python experiments/export_latency/export_latency.py [--calls 5000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import time_calls_ns, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

from ctrl_rl.algos.sac import SAC, SACConfig  # noqa: E402
from ctrl_rl.core.obs import ObsPart  # noqa: E402
from ctrl_rl.deploy.export import ExportModule, _export_onnx, example_inputs, input_name  # noqa: E402
from ctrl_rl.deploy.sidecar import onnx_session  # noqa: E402
from ctrl_rl.envs.protocol import EnvSpec  # noqa: E402


def policies() -> dict[str, tuple[ExportModule, EnvSpec]]:
    mlp_spec = EnvSpec("bench:mlp", (17,), False, 6, (-1.0,) * 6, (1.0,) * 6)
    img_parts = (ObsPart("image/wrist", (3, 84, 84), torch.uint8), ObsPart("state", (7,), torch.float32))
    img_spec = EnvSpec("bench:image", (7,), False, 7, (-1.0,) * 7, (1.0,) * 7, obs_parts=img_parts)
    out = {}
    for name, spec in (("mlp", mlp_spec), ("image", img_spec)):
        algo = SAC(SACConfig(actor_hidden=(256, 256), critic_hidden=(256, 256)), spec, "cpu",
                   torch.Generator().manual_seed(0))
        out[name] = (ExportModule(algo.exportable().eval(), spec).eval(), spec)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--warmup", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows, raw = [], {}
    with tempfile.TemporaryDirectory() as d:
        for name, (module, spec) in policies().items():
            args = example_inputs(spec, 2, torch.Generator().manual_seed(0))
            names = [input_name(p.name) for p in spec.parts]
            path = Path(d) / f"{name}.onnx"
            _export_onnx(module, args, names, ["action"], path)
            sess = onnx_session(path)
            one = [x[:1] for x in args]
            feed = {n: x.numpy() for n, x in zip(names, one)}
            with torch.inference_mode():
                diff = float(np.abs(sess.run(None, feed)[0] - module(*one).numpy()).max())

            def eager():
                with torch.inference_mode():
                    module(*one)  # noqa: B023 -- timed and discarded within this iteration

            def ort():
                sess.run(None, feed)  # noqa: B023 -- timed and discarded within this iteration

            stats = {"onnxruntime": [], "torch_eager": []}
            for fn in (ort, eager):
                time_calls_ns(fn, a.warmup)
            for _ in range(a.repeats):
                for label, fn in (("onnxruntime", ort), ("torch_eager", eager)):
                    t = time_calls_ns(fn, a.calls) / 1e3  # us
                    stats[label].append((float(np.percentile(t, 50)), float(np.percentile(t, 99))))
            for label, reps in stats.items():
                p50 = float(np.median([r[0] for r in reps]))
                p99 = float(np.median([r[1] for r in reps]))
                rows.append({"policy": name, "runtime": label, "p50_us": p50, "p99_us": p99,
                             "repeats_p99_us": [r[1] for r in reps], "max_abs_diff": diff})
                print(f"{name:6s} {label:12s} p50 {p50:8.1f} us  p99 {p99:8.1f} us   (onnx vs eager {diff:.1e})")
            raw[name] = stats
    lines = ["# Exported policy latency at batch 1", "",
             f"`python experiments/export_latency/export_latency.py --calls {a.calls} --repeats {a.repeats}`: "
             f"each cell is the median over {a.repeats} repeats of that repeat's percentile over {a.calls} "
             "single calls "
             "(one thread on each side).", "",
             "| policy | runtime | p50 (us) | p99 (us) | p99 per repeat (us) |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['policy']} | {r['runtime']} | {r['p50_us']:.1f} | {r['p99_us']:.1f} | "
                     + ", ".join(f"{x:.0f}" for x in r["repeats_p99_us"]) + " |")
    mlp = {r["runtime"]: r for r in rows if r["policy"] == "mlp"}
    lines += ["", f"256x256 MLP p99 in onnxruntime: {mlp['onnxruntime']['p99_us']:.1f} us (target <= 100 us: "
              f"{'met' if mlp['onnxruntime']['p99_us'] <= 100 else 'NOT met'}).", ""]
    write_result("export_latency", {"calls": a.calls, "repeats": a.repeats, "rows": rows,
                                    "torch": torch.__version__}, "\n".join(lines), folder=RESULTS)


if __name__ == "__main__":
    main()
