"""Run one of the official NeuBay scripts as it is, with the shim in place, and time its gradient steps:

    python launch.py CHECKOUT/offline_cont.py --config-path=CHECKOUT/configs/d4rl_loco --config-name=base ...
    python launch.py CHECKOUT/offline_world/cont_ensemble.py --config-path=... --config-name=base ...

What it changes, and nothing else:

1. ``sys.path``: this folder (the fake ``d4rl`` and ``wandb`` packages) and the checkout first, as the official
   README's ``export PYTHONPATH=${PWD}`` puts the checkout.
2. Observation only (the official functions run unchanged): ``online_rl.ac_losses.sac_update`` (the jitted gradient
   step ``offline_cont.py`` imports by name), ``ContCollector.__call__`` (one collection of imagined rollouts) and
   ``ContEvaluator.__call__`` (evaluation in the real env) are wrapped by timers. The first
   ``$NEUBAY_SHIM_WARMUP`` gradient steps (default 3; the first one compiles) are each waited for
   (``jax.block_until_ready``) and timed alone; from the end of the last of them a wall-clock window runs, without
   further waiting (so JAX's asynchronous dispatch overlaps the next batch's sampling with the running step, as in
   the official loop), until step ``$NEUBAY_SHIM_STEPS``, whose outputs are waited for. Then the run stops (a
   ``BaseException`` that hydra does not catch) and the timings go to ``$NEUBAY_SHIM_TIMING`` (JSON): the window's
   steps and seconds, the seconds of collections and evaluations inside it, and every collection's figures.
   Without ``$NEUBAY_SHIM_STEPS`` the script runs to its own end.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
from pathlib import Path


class StopRun(BaseException):
    """Raised by the step timer after ``$NEUBAY_SHIM_STEPS`` gradient steps; hydra passes BaseExceptions on."""


T: dict = {"warmup_step_seconds": [], "collections": [], "evaluations": [], "window": None, "steps_done": 0}


def _wait(tree) -> None:
    import equinox as eqx
    import jax

    jax.block_until_ready(eqx.filter(tree, eqx.is_array))


def install_timers(stop_after: int | None, warmup: int) -> None:
    import experience.collector as collector
    import experience.evaluator as evaluator
    import online_rl.ac_losses as losses

    sac_update = losses.sac_update

    def timed_sac_update(*args, **kwargs):
        n = T["steps_done"] + 1
        if n <= warmup:
            t0 = time.perf_counter()
            out = sac_update(*args, **kwargs)
            _wait(out)
            T["warmup_step_seconds"].append(round(time.perf_counter() - t0, 4))
            if n == warmup:
                T["window"] = {"t_start": time.perf_counter(), "first_step": n + 1}
        else:
            out = sac_update(*args, **kwargs)
        T["steps_done"] = n
        if stop_after is not None and n >= stop_after:
            _wait(out)
            w = T["window"]
            w["t_end"] = time.perf_counter()
            w["last_step"] = n
            raise StopRun
        return out

    losses.sac_update = timed_sac_update

    def timer(kind: str, fn):
        def call(self, *args, **kwargs):
            t0 = time.perf_counter()
            result = fn(self, *args, **kwargs)
            t1 = time.perf_counter()
            row = {"after_step": T["steps_done"], "t0": t0, "t1": t1, "seconds": round(t1 - t0, 4)}
            metrics = result[1] if isinstance(result, tuple) and len(result) == 2 else {}
            for k in ("data_size", "horizon_mean", "length", "reward", "normalized_score"):
                if k in metrics:
                    row[k] = float(metrics[k])
            T[kind].append(row)
            print(f"[shim] {kind[:-1]} after step {row['after_step']}: {row['seconds']:.2f} s "
                  + ", ".join(f"{k} {row[k]:.4g}" for k in row if k not in ("after_step", "t0", "t1", "seconds")),
                  flush=True)
            return result
        return call

    collector.ContCollector.__call__ = timer("collections", collector.ContCollector.__call__)
    evaluator.ContEvaluator.__call__ = timer("evaluations", evaluator.ContEvaluator.__call__)


def summary() -> dict:
    out = {k: T[k] for k in ("warmup_step_seconds", "steps_done")}
    w = T["window"]
    if w and "t_end" in w:
        inside = lambda rows: sum(r["t1"] - r["t0"] for r in rows if r["t0"] >= w["t_start"])  # noqa: E731
        steps = w["last_step"] - w["first_step"] + 1
        seconds = w["t_end"] - w["t_start"]
        coll, ev = inside(T["collections"]), inside(T["evaluations"])
        out["window"] = {"first_step": w["first_step"], "last_step": w["last_step"], "steps": steps,
                         "seconds": round(seconds, 4), "collection_seconds": round(coll, 4),
                         "evaluation_seconds": round(ev, 4),
                         "steps_per_s": steps / seconds,
                         "update_steps_per_s": steps / (seconds - coll - ev)}
    for kind in ("collections", "evaluations"):
        out[kind] = [{k: v for k, v in r.items() if k not in ("t0", "t1")} for r in T[kind]]
    return out


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python launch.py CHECKOUT/SCRIPT.py [hydra overrides]")
    script = Path(sys.argv[1]).resolve()
    if not script.is_file():
        raise SystemExit(f"no official script at {script}: expected offline_cont.py or offline_world/cont_ensemble.py "
                         "of a twni2016/neubay checkout")
    checkout = script.parent if script.name == "offline_cont.py" else script.parent.parent
    sys.path[:0] = [str(Path(__file__).resolve().parent), str(checkout)]
    import jax

    print(f"[shim] jax {jax.__version__} backend {jax.default_backend()} devices {jax.devices()}", flush=True)
    stop = int(os.environ["NEUBAY_SHIM_STEPS"]) if os.environ.get("NEUBAY_SHIM_STEPS") else None
    warmup = int(os.environ.get("NEUBAY_SHIM_WARMUP", "3"))
    if script.name == "offline_cont.py":
        install_timers(stop, warmup)
    sys.argv = [str(script), *sys.argv[2:]]
    stopped = False
    try:
        runpy.run_path(str(script), run_name="__main__")
    except StopRun:
        stopped = True
    except SystemExit as e:  # hydra exits 0 at the end of a run (and 1 on an error it reported)
        if e.code not in (None, 0):
            raise
    finally:
        if os.environ.get("NEUBAY_SHIM_TIMING"):
            Path(os.environ["NEUBAY_SHIM_TIMING"]).write_text(json.dumps({"stopped_by_shim": stopped, **summary()},
                                                                         indent=1))
    print(f"[shim] done: {T['steps_done']} gradient steps{' (stopped by the shim)' if stopped else ''}", flush=True)


if __name__ == "__main__":
    main()
