"""Benchmark: the batched dynamics ensemble (``ctrl_rl.world_models.ensemble``) against a per-member Python loop.

Both sides are RAVL's model: 7 members, 4 x 200 SiLU hidden layers, HalfCheetah-sized inputs (obs 17, action 6)
and outputs (mean and log-variance of 17 + 1 targets), learned soft log-variance bounds per member, per-layer
weight decay through Adam parameter groups. The loop side keeps one ``nn.Sequential`` of ``nn.Linear`` layers per
member and runs them one after the other, as RAVL's and MBPO's code do.

(a) one training step: every member gets its own batch of 256 rows (drawn from 100k random rows), forward,
    Gaussian NLL + log-variance bound penalty summed over members, backward, Adam step. The loop side runs with
    fused Adam (the same optimizer as the batched side: the difference is batching alone) and with torch's
    default Adam (what a per-member implementation gets without asking; RAVL's code).
(b) prediction for 50k states: ``EnsembleDynamics.predict`` (a random elite per row, sampled, with the three
    uncertainty figures; rows in chunks: the automatic size, 10,000, and all at once) against the loop: each of
    the 5 elites on all 50k rows (RAVL's way), stacked, then the same selection, sampling and uncertainty
    figures; and the loop in the batched side's automatic chunks (so that batching and chunking separate).
    Speedups are against the loop on all rows at once.

Variants run interleaved in every repeat (so drifts of the machine's speed hit them alike); tables give medians
over ``--repeats``. FLOPs are counted with torch.utils.flop_counter; the batched side's GFLOP/s is given as a
fraction of a large float32 matmul's (2048 x 2048 @ 2048 x 2048) measured in the same run on the same threads.

    python experiments/world_models/world_model_ensemble.py [--repeats 5] [--threads 1] [--train-steps 40]
                                                     [--predict-calls 3] [--states 50000]

Writes experiments/world_models/world_model_ensemble.json and .md and prints the table (``--markdown-only``: rewrites
the .md from the saved .json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from ctrl_rl.world_models.ensemble import DynamicsConfig, EnsembleDynamics, make_optimizer, soft_clamp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # experiments/: common.py, peers/
from common import write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent  # this study's folder: its results live beside the script

OBS, ACT, ROWS, BATCH = 17, 6, 100_000, 256
D = OBS + 1


class LoopEnsemble(nn.Module):
    """E separate ``nn.Linear`` stacks with the same sizes, activation, init scale and log-variance bounds."""

    def __init__(self, cfg: DynamicsConfig):
        super().__init__()
        dims = (OBS + ACT, *cfg.hidden, 2 * D)
        self.nets = nn.ModuleList()
        for _ in range(cfg.members):
            layers: list[nn.Module] = []
            for j, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
                layers.append(nn.Linear(a, b))
                if j < len(dims) - 2:
                    layers.append(nn.SiLU())
            self.nets.append(nn.Sequential(*layers))
        self.max_logvar = nn.ParameterList(nn.Parameter(torch.full((1, D), 0.5)) for _ in range(cfg.members))
        self.min_logvar = nn.ParameterList(nn.Parameter(torch.full((1, D), -10.0)) for _ in range(cfg.members))
        self.cfg = cfg

    def member(self, e: int, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.nets[e](x)  # [B,2D]
        return out[:, :D], soft_clamp(out[:, D:], self.min_logvar[e], self.max_logvar[e])

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        total = x.new_zeros(())
        for e in range(self.cfg.members):
            mean, logvar = self.member(e, x[e])
            total = total + (logvar + (y[e] - mean).square() * torch.exp(-logvar)).mean()
            total = total + 0.01 * (self.max_logvar[e].sum() - self.min_logvar[e].sum())
        return total

    def optimizer(self, fused: bool) -> torch.optim.Adam:
        groups = []
        for net in self.nets:
            lins = [m for m in net if isinstance(m, nn.Linear)]
            groups += [{"params": [lin.weight], "weight_decay": wd} for lin, wd in zip(lins, self.cfg.weight_decay)]
            groups.append({"params": [lin.bias for lin in lins], "weight_decay": 0.0})
        groups.append({"params": [*self.max_logvar, *self.min_logvar], "weight_decay": 0.0})
        return torch.optim.Adam(groups, lr=self.cfg.lr, fused=fused or None)

    @torch.no_grad()
    def predict(self, model: EnsembleDynamics, obs: torch.Tensor, act: torch.Tensor, gen: torch.Generator,
                chunk: int | None = None):
        """The loop's prediction (rows in chunks of ``chunk``, None: all at once), with the batched model's
        statistics and elites, and the protocol's figures."""
        B, K = obs.shape[0], model.elite_ids.shape[0]
        chunk = chunk or B
        x = model.inputs(obs, act)  # [B,I]
        pos = torch.randint(K, (B,), generator=gen)  # [B]
        ys, uncs = [], []
        for s in range(0, B, chunk):
            outs = [self.member(int(e), x[s:s + chunk]) for e in model.elite_ids]
            mean, logvar = torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])  # [K,C,D]
            rows = torch.arange(mean.shape[1])
            m, lv = mean[pos[s:s + chunk], rows], logvar[pos[s:s + chunk], rows]  # [C,D]
            ys.append(m + torch.randn(m.shape, generator=gen) * (0.5 * lv).exp())
            var, epi = logvar.exp(), mean.var(0, unbiased=False)
            uncs.append(((var * model.target_std.square()).sum(-1).sqrt().amax(0), epi.mean(-1).sqrt(),
                         (epi + var.mean(0)).mean(-1)))
        y = torch.cat(ys) * model.target_std + model.target_mean  # [B,D]
        unc = dict(zip(("aleatoric", "epistemic", "total_var"), (torch.cat(u) for u in zip(*uncs))))
        return obs + y[:, :OBS], y[:, OBS], unc


def flops(fn: Callable[[], object]) -> float:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fc:
        fn()
    return float(fc.get_total_flops())


def matmul_peak(repeats: int = 5, n: int = 2048, calls: int = 10) -> float:
    """Median GFLOP/s of a float32 (n x n) @ (n x n) product on the current threads."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    rates = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(calls):
            a @ b
        rates.append(2 * n ** 3 * calls / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def timed(fn: Callable[[], object], n: int) -> float:
    """Seconds per call of ``fn`` over ``n`` calls."""
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def markdown(payload: dict) -> str:
    """The table and notes of ``payload`` (what ``main`` writes to the JSON file)."""
    st, rows, v = payload["setting"], payload["median"], payload["setting"]["versions"]
    auto, peak = st["predict_chunk_auto"], v["matmul_peak_gflops"]
    lines = ["| task | variant | ms (median) | speedup vs loop | GFLOP | GFLOP/s | of matmul peak |",
             "|---|---|---|---|---|---|---|"]
    for key, r in rows.items():
        part, name = key.split("/")
        lines.append(f"| {part} | {name} | {r['ms']:.1f} | {r['speedup_vs_loop']:.2f}x | {r['gflop']:.2f} | "
                     f"{r['gflop_per_s']:.1f} | {r['of_matmul_peak']:.0%} |")
    bp = rows[f"predict/batched_auto_chunk{auto}"]
    lines += ["", f"`python experiments/world_models/world_model_ensemble.py --repeats {st['repeats']} "
              f"--threads {st['threads']} "
              f"--train-steps {st['train_steps']} --predict-calls {st['predict_calls']} --states {st['states']}`; "
              f"{st['members']} members, 4x200 SiLU, obs {st['obs']}, action {st['act']}; training: batch "
              f"{st['batch_per_member']} per member, forward + backward + Adam; prediction: {st['states']} states, "
              f"{st['elites']} elites, sampled, with uncertainty figures. "
              f"Speedups against `loop_default_adam` (training) "
              f"and `loop` (prediction, all rows at once); batched training against the loop with fused Adam: "
              f"{rows['train/batched']['speedup_vs_loop_fused_adam']:.2f}x; batched prediction against the loop in the "
              f"same chunks of {auto} rows: {bp['speedup_vs_loop_same_chunks']:.2f}x. torch {v['torch']}, {v['cpus']} "
              f"CPUs, {st['threads']} thread(s), load average {v['loadavg_start']} at start and {v['loadavg_end']} at "
              f"end (other jobs shared the cores). Matmul peak (median GFLOP/s of a float32 2048^2 @ 2048^2 product, "
              f"this run): {peak}.", ""]
    for part, base in (("train", "train/loop_default_adam"), ("predict", "predict/loop")):
        need = 5 * rows[base]["gflop_per_s"]
        lines.append(f"- {part}: 5x the loop needs {need:.1f} GFLOP/s, {need / peak:.0%} of the matmul peak; the loop "
                     f"already runs at {rows[base]['of_matmul_peak']:.0%} of it. Both sides do the same FLOPs, so "
                     f"batching can only remove per-op overhead, which is small at these sizes.")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--train-steps", type=int, default=40, help="timed training steps per variant and repeat")
    ap.add_argument("--predict-calls", type=int, default=3, help="timed predictions per variant and repeat")
    ap.add_argument("--states", type=int, default=50_000)
    ap.add_argument("--markdown-only", action="store_true", help="rewrite the .md from the saved .json, run nothing")
    args = ap.parse_args()
    if args.markdown_only:
        payload = json.loads((RESULTS / "world_model_ensemble.json").read_text())
        (RESULTS / "world_model_ensemble.md").write_text(markdown(payload))
        print(markdown(payload))
        return
    threads_on_entry = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    versions = {"torch": torch.__version__, "python": platform.python_version(), "cpus": os.cpu_count(),
                "loadavg_start": round(os.getloadavg()[0], 2)}
    cfg = DynamicsConfig()
    g = torch.Generator().manual_seed(0)
    data_x, data_y = torch.randn(ROWS, OBS + ACT, generator=g), torch.randn(ROWS, D, generator=g)  # standardised
    obs, act = torch.randn(args.states, OBS, generator=g), torch.rand(args.states, ACT, generator=g) * 2 - 1

    torch.manual_seed(0)
    model = EnsembleDynamics(OBS, ACT, cfg)
    loop = LoopEnsemble(cfg)
    opts = {"batched": make_optimizer(model), "loop_fused_adam": loop.optimizer(True),
            "loop_default_adam": loop.optimizer(False)}

    def train_step(name: str) -> Callable[[], None]:
        def step() -> None:
            idx = torch.randint(ROWS, (cfg.members, BATCH), generator=g)  # [E,B]
            x, y = data_x[idx], data_y[idx]  # [E,B,I], [E,B,D]
            loss = model.loss(x, y)[0] if name == "batched" else loop.loss(x, y)
            opts[name].zero_grad(set_to_none=True)
            loss.backward()
            opts[name].step()
        return step

    def chunked(rows: int) -> EnsembleDynamics:
        m = EnsembleDynamics(OBS, ACT, DynamicsConfig(predict_chunk=rows))
        m.load_state_dict(model.state_dict())
        return m

    auto = model.chunk_rows(cfg.elites, torch.device("cpu"))
    m10k, whole = chunked(10_000), chunked(args.states)
    predicts = {f"batched_auto_chunk{auto}": lambda: model.predict(obs, act, generator=g),
                "batched_chunk10000": lambda: m10k.predict(obs, act, generator=g),
                f"batched_chunk{args.states}": lambda: whole.predict(obs, act, generator=g),
                "loop": lambda: loop.predict(model, obs, act, g),
                f"loop_chunk{auto}": lambda: loop.predict(model, obs, act, g, auto)}
    trains = {k: train_step(k) for k in opts}
    fl = {"train/batched": flops(trains["batched"]), "train/loop": flops(trains["loop_fused_adam"]),
          "predict/batched": flops(predicts[f"batched_auto_chunk{auto}"]), "predict/loop": flops(predicts["loop"])}
    for fn in (*trains.values(), *predicts.values()):  # warm-up
        fn()
    versions["matmul_peak_gflops"] = round(matmul_peak(), 1)
    runs: dict[str, list[float]] = {}
    for rep in range(args.repeats):
        for name, fn in trains.items():
            runs.setdefault(f"train/{name}", []).append(timed(fn, args.train_steps))
        for name, fn in predicts.items():
            runs.setdefault(f"predict/{name}", []).append(timed(fn, args.predict_calls))
        print(f"repeat {rep}: " + ", ".join(f"{k} {1e3 * v[-1]:.1f} ms" for k, v in runs.items()), flush=True)
    versions["loadavg_end"] = round(os.getloadavg()[0], 2)
    torch.set_num_threads(threads_on_entry)
    med = {k: statistics.median(v) for k, v in runs.items()}
    peak = versions["matmul_peak_gflops"]
    rows = {}
    for key, sec in med.items():
        part, name = key.split("/")
        base = med["train/loop_default_adam"] if part == "train" else med["predict/loop"]
        f = fl[f"{part}/{'batched' if name.startswith('batched') else 'loop'}"]
        rows[key] = {"ms": 1e3 * sec, "speedup_vs_loop": base / sec, "gflop": f / 1e9, "gflop_per_s": f / sec / 1e9,
                     "of_matmul_peak": f / sec / 1e9 / peak}
    rows["train/batched"]["speedup_vs_loop_fused_adam"] = med["train/loop_fused_adam"] / med["train/batched"]
    rows[f"predict/batched_auto_chunk{auto}"]["speedup_vs_loop_same_chunks"] = (
        med[f"predict/loop_chunk{auto}"] / med[f"predict/batched_auto_chunk{auto}"])
    payload = {"setting": {"members": cfg.members, "elites": cfg.elites, "hidden": cfg.hidden, "obs": OBS, "act": ACT,
                           "batch_per_member": BATCH, "states": args.states, "predict_chunk_auto": auto,
                           "repeats": args.repeats, "threads": args.threads, "train_steps": args.train_steps,
                           "predict_calls": args.predict_calls, "versions": versions},
               "runs_s": runs, "median": rows, "target": "batched >= 5x the per-member loop"}
    md = markdown(payload)
    print(md)
    write_result("world_model_ensemble", payload, md, folder=RESULTS)


if __name__ == "__main__":
    main()
