"""Where a NeuBay gradient step's time goes on one device: the update alone (registry defaults, Hopper's sizes, one
synthetic 2,048-row tape batch), timed per scan strategy, with the operator counts and the top operators of a
``torch.profiler`` trace.

    python experiments/model_based_speed/neubay_update_profile.py --device cuda --out $OUT/neubay_update_profile

Scan strategies of the LRU encoders' recurrence (``ctrl_rl.core.sequence``), forced for every length: ``blocked``
(``_blocked``: blocks of about sqrt(T) rows stepped together, O(T) work in ~sqrt(T) steps; the library's choice
on the CPU) and ``hillis`` (``_hillis_steele``: O(T log T) work in log2(T) steps; fewer, larger operations, which is
what a launch-bound device wants; the library's choice off the CPU since this measurement). Both
compute the same recurrence (checked here on the batch's encoder outputs). Writes ``OUT.json`` and ``OUT.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import torch

from ctrl_rl.algos.neubay import NeuBay, NeuBayConfig
from ctrl_rl.core import sequence
from ctrl_rl.envs.protocol import EnvSpec
from ctrl_rl.storage.tapes import TapeBatch

SCAN = sequence._scan  # the library's choice by device
STRATEGIES = {"blocked": sequence._blocked, "hillis": sequence._hillis_steele}


def tape_batch(rows: int, tape_len: int, obs_dim: int, act_dim: int, device: torch.device, seed: int) -> TapeBatch:
    """Tapes of ``tape_len`` rows (the last one cut) up to ``rows`` rows, the first half of every tape real."""
    g = torch.Generator().manual_seed(seed)
    first = torch.zeros(rows, dtype=torch.bool)
    first[::tape_len] = True
    real = (torch.arange(rows) % tape_len) < tape_len // 2
    obs = torch.randn(rows, obs_dim, generator=g)
    nxt = torch.randn(rows, obs_dim, generator=g)
    term = torch.zeros(rows, dtype=torch.bool)
    parts = (obs, torch.rand(rows, act_dim, generator=g) * 2 - 1, torch.randn(rows, generator=g), nxt, term,
             torch.zeros(rows, dtype=torch.bool), real, first)
    return TapeBatch(*(t.to(device) for t in parts), num_tapes=int(first.sum()))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_updates(algo: NeuBay, batch: TapeBatch, steps: int, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        algo.update(batch)
    sync(device)
    return (time.perf_counter() - t0) / steps


def profile(algo: NeuBay, batch: TapeBatch, steps: int, device: torch.device, top: int) -> dict:
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            algo.update(batch)
        sync(device)
    events = prof.key_averages()
    dev_key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    ops = [e for e in events if e.key.startswith("aten::")]
    kernels = [e for e in events if device.type == "cuda" and getattr(e, "device_type", None) is not None
               and str(e.device_type).endswith("CUDA")]
    rows = sorted(ops, key=lambda e: getattr(e, dev_key, 0), reverse=True)[:top]
    return {"aten_calls_per_update": sum(e.count for e in ops) / steps,
            "cuda_kernels_per_update": sum(e.count for e in kernels) / steps if kernels else None,
            "device_time_ms_per_update": sum(getattr(e, dev_key, 0) for e in ops) / 1000 / steps,
            "top": [{"op": e.key, "calls_per_update": e.count / steps,
                     "self_ms_per_update": getattr(e, dev_key, 0) / 1000 / steps} for e in rows]}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--tape-len", type=int, default=100)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--tiny", action="store_true", help="a small network instead of the defaults (tests)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    device = torch.device(args.device)
    spec = EnvSpec("Hopper-v5", (11,), False, 3, (-1.0,) * 3, (1.0,) * 3)
    batch = tape_batch(args.rows, args.tape_len, 11, 3, device, 0)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    p: dict = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "device": name,
               "torch": torch.__version__, "rows": args.rows, "tape_len": args.tape_len, "steps": args.steps,
               "threads": torch.get_num_threads(), "ms_per_update": {k: [] for k in STRATEGIES}, "profile": {}}
    agents = {}
    for k in STRATEGIES:
        torch.manual_seed(0)
        tiny = {"d_model": 16, "lru_hidden": 8, "head_hidden": (16, 16), "num_critics": 4}
        cfg = NeuBayConfig(**tiny) if args.tiny else NeuBayConfig()
        agents[k] = NeuBay(cfg, spec, device, torch.Generator(device).manual_seed(0))
    # the same recurrence: the critic encoder's outputs on the batch under both strategies
    seq, start, _ = NeuBay.sequence(batch)
    outs = {}
    for k, fn in STRATEGIES.items():
        sequence._scan = fn
        with torch.no_grad():
            outs[k] = agents["blocked"]._encode(agents["blocked"].critic_encoder, seq, start)
    p["max_abs_diff_encoder"] = float((outs["blocked"] - outs["hillis"]).abs().max())
    for k, fn in STRATEGIES.items():  # warm-up
        sequence._scan = fn
        time_updates(agents[k], batch, 3, device)
    for r in range(args.repeats):
        for k in (list(STRATEGIES) if r % 2 == 0 else list(STRATEGIES)[::-1]):
            sequence._scan = STRATEGIES[k]
            p["ms_per_update"][k].append(1000 * time_updates(agents[k], batch, args.steps, device))
            print(k, f"{p['ms_per_update'][k][-1]:.1f} ms/update", flush=True)
    for k, fn in STRATEGIES.items():
        sequence._scan = fn
        p["profile"][k] = profile(agents[k], batch, args.profile_steps, device, args.top)
    sequence._scan = SCAN
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(p, indent=2) + "\n")
    lines = [f"# NeuBay update on {name}: {args.rows} rows, tapes of {args.tape_len}", "",
             f"{p['date']}, torch {p['torch']}, encoder outputs max |blocked - hillis| "
             f"{p['max_abs_diff_encoder']:.2e}", "",
             "| scan | ms/update (median) | aten calls/update | CUDA kernels/update | device ms/update |",
             "|---|---|---|---|---|"]
    for k in STRATEGIES:
        pr = p["profile"][k]
        lines.append(f"| {k} | {statistics.median(p['ms_per_update'][k]):.1f} | {pr['aten_calls_per_update']:.0f} | "
                     f"{pr['cuda_kernels_per_update']} | {pr['device_time_ms_per_update']:.1f} |")
    for k in STRATEGIES:
        lines += ["", f"## top operators ({k})", "", "| op | calls/update | self ms/update |", "|---|---|---|"]
        lines += [f"| {t['op']} | {t['calls_per_update']:.0f} | {t['self_ms_per_update']:.2f} |"
                  for t in p["profile"][k]["top"]]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
