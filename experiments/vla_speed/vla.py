"""VLA fine-tuning on the tiny backbone on CPU, per action head (issue "VLA fine-tuning adapters", benchmark 1):
action-chunk latency, BC fine-tuning updates/s and peak memory; trainable parameter fraction with LoRA.

Rows: each of ``--heads`` (tokens, regression, flow) on ``smolvlm-tiny`` (random weights) with chunk H = 8, once
with LoRA rank 8 on the default targets (q/k/v/o_proj of the language model) and once with ``lora_rank=0`` (every
weight trained). The env is ``manip:Lift`` with one 48x64 camera and the instruction (``ENV``); the demonstrations
are 6 scripted Lift episodes in the LeRobot layout, generated once into ``runs/vla_bench/demos``.

Each configuration is measured in a fresh process (``--worker measure``, one torch thread), so that its peak
memory is its own. The process imports everything, builds the env (one instance, the observation the latency is
measured on) and loads the demonstrations, then reads ``ru_maxrss`` (the baseline), then:

- parameters: trainable and total of the ``vla_bc`` agent's ``algo.model.policy`` (the fraction is
  ``algo.model.trainable_fraction()``);
- BC updates/s: ``algo.update(batch)`` on batches of ``--batch`` random demonstration frames (drawn before the
  clock starts), ``--warmup-updates`` untimed, then ``--updates`` timed together;
- eager chunk latency at batch 1: ``policy.sample(model.prefix_from_obs(obs), gen, deterministic=True)``
  under ``torch.no_grad`` in eval mode, i.e. what ``algo.act`` costs on a step that plans a new chunk (the
  tokens head decodes its H*A = 56 action tokens one at a time with the KV cache; LoRA layers unmerged, as
  trained); ``--warmup-calls`` untimed, then ``--calls`` calls each timed alone, p50 and p99;
- peak RSS: ``ru_maxrss`` at the end, and its increase over the baseline.

Exported graph, per head, of the LoRA-rank-8 agent: a 2-update run trained with the CLI (``ctrl_rl train vla_bc
... --total-steps 2``), exported by ``ctrl_rl.deploy.export.export_run`` (what ``ctrl-rl export RUN --format
onnx`` runs; LoRA merged into the base weights; the tokens head unrolls its 56 greedy steps without a KV cache)
in a fresh process (``--worker export``): its wall time (checkpoint loading, tracing, onnxruntime parity check;
without interpreter start-up and imports) and the ONNX file size. A head whose ONNX export fails gets the error
sentence and a ``.pt2`` export instead (timed with ``torch.export.load(...).module()``). The graph is then timed
in a fresh process per repeat (``--worker onnx``): onnxruntime with one thread (``robots.export.onnx_session``),
each call feeding a ``SimRobot`` observation the way ``robots.runtime.ControlLoop`` does (``Prompter`` for the
``language`` input) and running the session, batch 1, p50 and p99. A full-fine-tuning (rank 0) agent exports the
same graph (same modules, same shapes; only the weights differ), so its rows repeat nothing.

Every figure is the median over ``--repeats`` repeats (each repeat runs every configuration once, in turn, so
that drifts of the shared machine hit all alike); latency cells are medians of each repeat's percentiles. The
per-action amortised latency is the chunk latency / H.

    python experiments/vla_speed/vla.py [--repeats 3] [--heads tokens regression flow] [--quick]

Writes experiments/vla_speed/vla_bench.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import ROOT, git_commit, time_calls_ns, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

ENV = "manip:Lift,cameras=exterior1,image_size=48x64,language=true"
DEMOS = ROOT / "runs" / "vla_bench" / "demos"
HEADS = ("tokens", "regression", "flow")
RANKS = (8, 0)
CHUNK = 8
BACKBONE = "smolvlm-tiny"


# ------------------------------------------------------------------------------------------------ workers
def _maxrss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _percentiles(ns: np.ndarray) -> dict:
    ms = ns / 1e6
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean())}


def worker_measure(a) -> dict:
    """One configuration in this (fresh) process: parameters, BC updates/s, eager chunk latency, peak RSS."""
    import peft  # noqa: F401  (imported before the baseline: the LoRA injection needs it)
    import torch

    import ctrl_rl.vla.backbones  # noqa: F401  (transformers: imported before the baseline)
    from ctrl_rl.algos.vla_bc import VLABC
    from ctrl_rl.envs import make_env
    from ctrl_rl.vla.data import load_demos
    from ctrl_rl.vla.model import VLAModelConfig

    torch.set_num_threads(1)
    env = make_env(ENV, 1, seed=0)
    spec = env.spec
    obs = env.reset(seed=0)
    base = env.unwrapped() if callable(getattr(env, "unwrapped", None)) else env
    cameras = [p.name.removeprefix("image/") for p in spec.parts if p.name.startswith("image/")]
    image_hw = tuple(next(p for p in spec.parts if p.name.startswith("image/")).shape[1:])
    demos = load_demos(a.demos, cameras, image_hw, CHUNK, spec.action_dim, getattr(base, "action_space_name", "") or "")
    rss0 = _maxrss_mb()

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    cfg = VLAModelConfig(backbone=BACKBONE, head=a.head, chunk=CHUNK, lora_rank=a.rank)
    algo = VLABC(cfg, spec, torch.device("cpu"), gen)
    model = algo.model
    model.set_statistics(demos.proprio, demos.action)
    params = list(model.policy.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)

    n = a.warmup_updates + a.updates
    rows = torch.randint(0, demos.num_frames, (n, a.batch), generator=torch.Generator().manual_seed(1))  # [n,B]
    batches = [demos.batch(r) for r in rows]
    for b in batches[: a.warmup_updates]:
        algo.update(b)
    t0 = time.perf_counter()
    for b in batches[a.warmup_updates:]:
        info = algo.update(b)
    seconds = time.perf_counter() - t0
    loss = float(info["loss/actor"])

    model.policy.eval()

    def plan():
        with torch.no_grad():
            model.policy.sample(model.prefix_from_obs(obs), algo.gen, deterministic=True)

    time_calls_ns(plan, a.warmup_calls)
    lat = _percentiles(time_calls_ns(plan, a.calls))
    env.close()
    rss1 = _maxrss_mb()
    return {"head": a.head, "lora_rank": a.rank, "trainable_params": trainable, "total_params": total,
            "trainable_fraction": model.trainable_fraction(), "updates": a.updates, "update_seconds": seconds,
            "updates_per_s": a.updates / seconds, "final_loss": loss, "eager": lat,
            "rss_baseline_mb": rss0, "rss_peak_mb": rss1, "rss_increase_mb": rss1 - rss0}


def worker_export(a) -> dict:
    """Export the run ``a.run`` (ONNX; .pt2 when ONNX fails) in this process and time it."""
    from ctrl_rl.deploy.export import ExportOptions, export_run

    out = {"run": a.run}
    for fmt in ("onnx", "pt2"):
        dest = Path(a.run) / f"export-{fmt}"
        t0 = time.perf_counter()
        try:
            meta = export_run(a.run, ExportOptions(format=(fmt,), out=str(dest)))
        except Exception as e:  # noqa: BLE001  (recorded: the benchmark reports the failing head and goes on)
            first = (str(e).strip().splitlines() or [""])[0][:400]
            out[fmt] = {"ok": False, "seconds": time.perf_counter() - t0, "error": f"{type(e).__name__}: {first}"}
            continue
        f = dest / meta["files"][fmt]
        out[fmt] = {"ok": True, "seconds": time.perf_counter() - t0, "dir": str(dest), "file": str(f),
                    "bytes": f.stat().st_size, "parity": meta["parity"][fmt]}
        break  # .pt2 only when ONNX failed
    return out


def worker_graph(a) -> dict:
    """Time the exported graph in ``a.export`` at batch 1 on a SimRobot observation (fresh process)."""
    from ctrl_rl.deploy.runtime import OnnxPolicy, Prompter, SimRobot
    from ctrl_rl.deploy.sidecar import read_export

    d = Path(a.export)
    meta = read_export(d)
    robot = SimRobot(ENV, seed=0)
    obs = robot.observe()
    prompter = Prompter(d, meta["language"]) if meta.get("language") else None
    names = [i["name"] for i in meta["inputs"]]
    dtypes = {i["name"]: np.dtype(i["dtype"]) for i in meta["inputs"]}

    def feed() -> dict:  # ControlLoop._feed without the recurrent inputs
        f = {n: np.asarray(obs.parts[n], dtype=dtypes[n])[None] for n in names}
        if prompter is not None:
            f["language"] = prompter(obs.parts["language"])[None]
        return f

    if "onnx" in meta["files"]:
        runtime = "onnxruntime"
        policy = OnnxPolicy(d / meta["files"]["onnx"])

        def call():
            policy(feed())
    else:
        import torch

        torch.set_num_threads(1)
        runtime = "pt2"
        module = torch.export.load(str(d / meta["files"]["pt2"])).module()

        def call():
            with torch.no_grad():
                module(*(torch.from_numpy(x) for x in feed().values()))

    time_calls_ns(call, a.warmup_calls)
    out = _percentiles(time_calls_ns(call, a.calls))
    robot.close()
    return {"runtime": runtime, **out}


# ------------------------------------------------------------------------------------------------ driver
def _run(cmd: list[str], what: str) -> str:
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{what} failed (exit {r.returncode}):\n{' '.join(cmd)}\n{r.stderr[-3000:]}")
    return r.stdout


def _worker(mode: str, a, **kw) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", mode, "--demos", str(a.demos),
           "--updates", str(a.updates), "--warmup-updates", str(a.warmup_updates), "--batch", str(a.batch),
           "--calls", str(a.calls), "--warmup-calls", str(a.warmup_calls)]
    for k, v in kw.items():
        cmd += [f"--{k}", str(v)]
    out = _run(cmd, f"worker {mode} {kw}")
    return json.loads(out.strip().splitlines()[-1])


def ensure_demos(path: Path) -> None:
    if (path / "meta" / "info.json").is_file():
        return
    _run([sys.executable, "-m", "ctrl_rl", "data", "generate", "--env", "manip:Lift", "--level", "scripted",
          "--format", "lerobot", "--episodes", "6", "--cameras", "exterior1", "--image-size", "48x64",
          "--out", str(path), "--no-progress"], "demonstration generation")


def train_run(head: str, demos: Path, run_dir: Path) -> None:
    _run([sys.executable, "-m", "ctrl_rl", "train", "vla_bc", "--env", ENV, "--dataset", str(demos), "--head", head,
          "--backbone", BACKBONE, "--chunk", str(CHUNK), "--lora-rank", "8", "--total-steps", "2",
          "--eval-episodes", "1", "--threads", "1", "--no-progress", "--run-dir", str(run_dir)], f"training {head}")


def _med(xs) -> float:
    return float(np.median(xs))


def summarise(measures: dict, graphs: dict, heads, H: int) -> list[dict]:
    rows = []
    for head in heads:
        for rank in RANKS:
            ms = measures[(head, rank)]
            row = {"head": head, "lora_rank": rank,
                   "trainable_params": ms[0]["trainable_params"], "total_params": ms[0]["total_params"],
                   "trainable_fraction": ms[0]["trainable_fraction"],
                   "updates_per_s": _med([m["updates_per_s"] for m in ms]),
                   "updates_per_s_repeats": [m["updates_per_s"] for m in ms],
                   "eager_p50_ms": _med([m["eager"]["p50_ms"] for m in ms]),
                   "eager_p99_ms": _med([m["eager"]["p99_ms"] for m in ms]),
                   "rss_peak_mb": _med([m["rss_peak_mb"] for m in ms]),
                   "rss_baseline_mb": _med([m["rss_baseline_mb"] for m in ms]),
                   "rss_increase_mb": _med([m["rss_increase_mb"] for m in ms]),
                   "final_loss": [m["final_loss"] for m in ms]}
            row["eager_per_action_p50_ms"] = row["eager_p50_ms"] / H
            g = graphs.get(head) if rank == RANKS[0] else None
            if g:
                row.update(graph_runtime=g[0]["runtime"], graph_p50_ms=_med([x["p50_ms"] for x in g]),
                           graph_p99_ms=_med([x["p99_ms"] for x in g]))
                row["graph_per_action_p50_ms"] = row["graph_p50_ms"] / H
            rows.append(row)
    return rows


def markdown(a, rows: list[dict], exports: dict, meta: dict) -> str:
    H = CHUNK
    lines = ["# VLA fine-tuning on CPU: chunk latency, BC updates/s, memory, LoRA fraction", "",
             f"`{meta['command']}`", "",
             f"Commit {meta['commit']}; torch {meta['torch']}, onnxruntime {meta['onnxruntime']}; "
             f"{meta['cpus']} CPU cores, one torch / onnxruntime thread; wall time {meta['seconds'] / 60:.1f} min.",
             "",
             f"The machine is shared with other jobs (load average {meta['load_start'][0]:.2f} / "
             f"{meta['load_start'][1]:.2f} / {meta['load_start'][2]:.2f} at the start, {meta['load_end'][0]:.2f} / "
             f"{meta['load_end'][1]:.2f} / {meta['load_end'][2]:.2f} at the end, on 2 cores): absolute rates and "
             "latencies move between days; only ratios between rows of this run carry over.", "",
             f"Backbone `{BACKBONE}` (random weights), chunk H = {H}, env `{ENV}` (7-dim actions, so the tokens head "
             f"decodes {H * 7} tokens per chunk), {meta['demo_frames']} demonstration frames (6 scripted Lift "
             f"episodes). Each cell: median over {a.repeats} repeat(s), each configuration in a fresh process. "
             f"Updates/s: `algo.update` at batch {a.batch}, {a.updates} updates after {a.warmup_updates} warm-up. "
             f"Latency: one chunk at batch 1 ({a.calls} calls after {a.warmup_calls}); eager is "
             "`policy.sample(prefix_from_obs(obs), deterministic=True)` (what `act` costs when it plans), ONNX is "
             "onnxruntime on the exported graph (LoRA merged) with the runtime's input building. Peak RSS: "
             "`ru_maxrss` at the end of the process (+ increase over the value after imports, env and demos).", "",
             "| head | LoRA rank | trainable / total (fraction) | BC updates/s (batch 16) "
             "| chunk latency eager p50/p99 ms | ONNX p50/p99 ms | peak RSS MB (+increase) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "graph_p50_ms" in r:
            tag = "" if r["graph_runtime"] == "onnxruntime" else f" ({r['graph_runtime']}: ONNX failed)"
            graph = f"{r['graph_p50_ms']:.2f} / {r['graph_p99_ms']:.2f}{tag}"
        elif r["lora_rank"] == 0 and r["head"] in exports:
            graph = "same graph as rank 8"
        else:
            graph = "export failed"
        lines.append(f"| {r['head']} | {r['lora_rank'] or '0 (full)'} | {r['trainable_params']:,} / "
                     f"{r['total_params']:,} ({r['trainable_fraction']:.1%}) | {r['updates_per_s']:.1f} | "
                     f"{r['eager_p50_ms']:.2f} / {r['eager_p99_ms']:.2f} | {graph} | "
                     f"{r['rss_peak_mb']:.0f} (+{r['rss_increase_mb']:.0f}) |")
    lines += ["", f"Per action, amortised over the chunk (p50 / {H}), and the export of each head (LoRA rank 8, "
              "one export; wall time of `export_run` without interpreter start-up: load, trace, onnxruntime "
              "parity check):", "",
              "| head | eager ms / action | ONNX ms / action | ONNX over eager (p50) | export s | ONNX file MB | "
              "export parity | note |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["lora_rank"] != RANKS[0]:
            continue
        e = exports.get(r["head"], {})
        onnx = e.get("onnx", {})
        pt2 = e.get("pt2", {})
        note = "" if onnx.get("ok") else f"ONNX: {onnx.get('error', 'not run')}" + (
            f"; pt2 exported in {pt2['seconds']:.1f} s ({pt2['bytes'] / 1e6:.2f} MB)" if pt2.get("ok") else
            f"; pt2: {pt2.get('error', 'not run')}")
        g = r.get("graph_per_action_p50_ms")
        ratio = f"{r['graph_p50_ms'] / r['eager_p50_ms']:.2f}x" if g is not None else "-"
        lines.append(f"| {r['head']} | {r['eager_per_action_p50_ms']:.3f} | {f'{g:.3f}' if g is not None else '-'} | "
                     f"{ratio} | {onnx.get('seconds', float('nan')):.1f} | "
                     f"{onnx['bytes'] / 1e6:.2f} | {onnx['parity']:.1e} | {note} |" if onnx.get("ok") else
                     f"| {r['head']} | {r['eager_per_action_p50_ms']:.3f} | {f'{g:.3f}' if g is not None else '-'} | "
                     f"{ratio} | {onnx.get('seconds', float('nan')):.1f} (failed) | - | - | {note} |")
    per_rep = [f"{r['head']} r{r['lora_rank']} " + ", ".join(f"{x:.1f}" for x in r["updates_per_s_repeats"])
               for r in rows]
    lines += ["", "Updates/s per repeat: " + "; ".join(per_rep) + ".", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--heads", nargs="+", choices=HEADS, default=list(HEADS))
    ap.add_argument("--quick", action="store_true", help="one repeat, few updates and calls: a fast check")
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--warmup-updates", type=int, default=5)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--warmup-calls", type=int, default=10)
    ap.add_argument("--demos", type=Path, default=DEMOS)
    ap.add_argument("--worker", choices=("measure", "export", "graph"), help=argparse.SUPPRESS)
    ap.add_argument("--head", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--export", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        fn = {"measure": worker_measure, "export": worker_export, "graph": worker_graph}[a.worker]
        print(json.dumps(fn(a)))
        return
    if a.quick:
        a.repeats, a.updates, a.warmup_updates, a.calls, a.warmup_calls = 1, 4, 1, 10, 2

    t_start, load_start = time.perf_counter(), os.getloadavg()
    command = "python experiments/vla_speed/vla.py " + " ".join(shlex.quote(x) for x in argv)
    print(command.strip(), f"(load {load_start[0]:.2f})", flush=True)
    ensure_demos(a.demos)

    exports, measures, graphs = {}, {(h, r): [] for h in a.heads for r in RANKS}, {h: [] for h in a.heads}
    with tempfile.TemporaryDirectory(prefix="vla_bench-") as tmp:
        for head in a.heads:
            run_dir = Path(tmp) / f"run-{head}"
            t0 = time.perf_counter()
            train_run(head, a.demos, run_dir)
            exports[head] = e = _worker("export", a, run=run_dir)
            ok = next((f for f in ("onnx", "pt2") if e.get(f, {}).get("ok")), None)
            e["graph_dir"] = e[ok]["dir"] if ok else None
            print(f"{head}: 2-update run + export {time.perf_counter() - t0:.0f} s; "
                  + "; ".join(f"{f} {'ok' if e[f]['ok'] else e[f]['error']} ({e[f]['seconds']:.1f} s)"
                              for f in ("onnx", "pt2") if f in e), flush=True)
        for rep in range(a.repeats):
            for head in a.heads:
                for rank in RANKS:
                    m = _worker("measure", a, head=head, rank=rank)
                    measures[(head, rank)].append(m)
                    print(f"[{rep + 1}/{a.repeats}] {head:10s} rank {rank}: {m['updates_per_s']:6.1f} upd/s  eager "
                          f"p50 {m['eager']['p50_ms']:7.2f} ms p99 {m['eager']['p99_ms']:7.2f} ms  RSS "
                          f"{m['rss_peak_mb']:.0f} MB (+{m['rss_increase_mb']:.0f})", flush=True)
                if exports[head]["graph_dir"]:
                    g = _worker("graph", a, export=exports[head]["graph_dir"])
                    graphs[head].append(g)
                    print(f"[{rep + 1}/{a.repeats}] {head:10s} {g['runtime']}: p50 {g['p50_ms']:7.2f} ms "
                          f"p99 {g['p99_ms']:7.2f} ms", flush=True)
        for e in exports.values():  # the export files live in the temporary directory
            for f in ("onnx", "pt2"):
                if f in e:
                    e[f].pop("dir", None), e[f].pop("file", None)
            e.pop("run", None), e.pop("graph_dir", None)

    import onnxruntime
    import torch

    info = json.loads((a.demos / "meta" / "info.json").read_text())
    rows = summarise(measures, graphs, a.heads, CHUNK)
    meta = {"command": command.strip(), "commit": git_commit(), "torch": torch.__version__,
            "onnxruntime": onnxruntime.__version__, "cpus": os.cpu_count(), "load_start": load_start,
            "load_end": os.getloadavg(), "seconds": time.perf_counter() - t_start,
            "demo_frames": info.get("total_frames")}
    md = markdown(a, rows, exports, meta)
    print(md)
    payload = {**meta, "env": ENV, "backbone": BACKBONE, "chunk": CHUNK, "repeats": a.repeats, "batch": a.batch,
               "updates": a.updates, "warmup_updates": a.warmup_updates, "calls": a.calls,
               "warmup_calls": a.warmup_calls, "quick": a.quick, "rows": rows, "exports": exports,
               "raw": {"measure": {f"{h}/{r}": v for (h, r), v in measures.items()}, "graph": graphs}}
    if a.quick:  # a fast check must not overwrite the benchmark's results
        print("--quick: experiments/vla_speed/vla_bench.{json,md} not written")
        return
    write_result("vla_bench", payload, md, folder=RESULTS)


if __name__ == "__main__":
    main()
