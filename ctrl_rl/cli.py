"""The `ctrl-rl` command line: train, eval, data, plot, list.

    ctrl-rl train ppo|sac|sac_flow|cql|calql|iql|wsrl|rlpd|sac_flow_o2o --env ID [--num-envs N] [--total-steps S] [--seed K] [--run-dir DIR]
                      [--preset NAME] [--device cpu|cuda] [--resume DIR] [every hyperparameter of the algorithm]
    ctrl-rl eval RUN_DIR_OR_CHECKPOINT [--episodes N] [--env ID] [--seed K]
    ctrl-rl data info PATH_OR_ID [--env ID] [--refs d4rl|local|PATH]
    ctrl-rl data generate --env Hopper-v5|HalfCheetah-v5|Walker2d-v5 --level random|medium|expert|medium-expert|medium-replay|all
                          [--steps N] [--seed K] [--num-envs N] [--workers W] [--out PATH] [--force] [--from-run DIR]
    ctrl-rl plot RUN_DIR [--out PNG]
    ctrl-rl list envs|algos|presets

Flags of `train` come from the typed config dataclasses through tyro. Bad input (unknown env, algo,
preset or flag, invalid values, missing or broken run directories and checkpoints) prints one sentence
to stderr and exits with code 2 before anything is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Generic, TypeVar

import tyro

from ctrl_rl.config import RunConfig
from ctrl_rl.errors import UserInputError

USAGE = __doc__.split("\n\n")[1]
C = TypeVar("C")

ALGOS = {"ppo": "Proximal Policy Optimization for many parallel envs (Gaussian or categorical head)",
         "sac": "Soft Actor-Critic: batched critic ensemble (REDQ subset), UTD ratio, CrossQ option",
         "sac_flow": "SAC Flow: flow policy (Flow-G gated, Flow-T decoded or naive velocity) trained with SAC",
         "cql": "Conservative Q-Learning, offline (--dataset), WSRL's pre-training settings; loads into SAC",
         "calql": "Cal-QL: CQL with the Monte-Carlo return as a lower bound, offline (--dataset)",
         "iql": "Implicit Q-Learning, offline (--dataset): expectile value, advantage-weighted actor",
         "wsrl": "WSRL: online SAC fine-tuning of a cql/calql run (--init), warm-up with the frozen policy, no offline data",
         "rlpd": "RLPD baseline: online SAC from scratch with 50/50 offline (--dataset) and online batches",
         "sac_flow_o2o": "SAC Flow offline-to-online: flow-matching pre-training on --dataset, then online SAC Flow"}
OFF_POLICY = {"sac", "sac_flow", "wsrl", "rlpd", "sac_flow_o2o"}
OFFLINE = {"cql", "calql", "iql"}


@dataclass(frozen=True)
class TrainArgs(Generic[C]):
    """RunConfig and the algorithm's config, both flattened into one flag namespace."""

    run: Annotated[RunConfig, tyro.conf.OmitArgPrefixes]
    algo: Annotated[C, tyro.conf.OmitArgPrefixes]


RESUME_OVERRIDES = {"total_steps", "progress", "threads", "collect_threads", "log_every", "checkpoint_every", "resume",
                    "save_replay", "keep_every"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from ctrl_rl.learn.onpolicy import TrainingDiverged

    try:
        return _dispatch(argv)
    except UserInputError as e:
        print(f"ctrl-rl: error: {e}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:
        print(f"ctrl-rl: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("ctrl-rl: interrupted; the last checkpoint is kept", file=sys.stderr)
        return 130
    except BrokenPipeError:  # stdout closed early (e.g. `| head`): not an error of the command
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage:\n" + USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    commands = {"train": cmd_train, "eval": cmd_eval, "data": cmd_data, "plot": cmd_plot, "list": cmd_list}
    if cmd not in commands:
        raise UserInputError(f"unknown command {cmd!r}: expected one of {sorted(commands)}")
    return commands[cmd](rest)


# -- argument parsing helpers ------------------------------------------------------------------------------
def _flag_names(*classes: type) -> set[str]:
    names = {"--help", "-h"}
    for cls in classes:
        for f in dataclasses.fields(cls):
            n = f.name.replace("_", "-")
            names |= {f"--{n}", f"--{f.name}", f"--no-{n}", f"--no_{f.name}"}
    return names


def _check_flags(args: list[str], valid: set[str], command: str) -> None:
    import difflib

    for tok in args:
        if tok.startswith("-") and not re.fullmatch(r"-\d.*|-\.\d.*|-inf|-nan", tok):
            name = tok.split("=", 1)[0]
            if name not in valid:
                close = difflib.get_close_matches(name, sorted(valid), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise UserInputError(f"unknown flag {name!r} for `{command}`{hint}: see `{command} --help` for the flags it takes")


def _tyro_parse(cls, args: list[str], default, prog: str):
    """Run tyro, turning its boxed error into one sentence (UserInputError) and passing --help through."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return tyro.cli(cls, args=args, default=default, prog=prog)
    except SystemExit as e:
        if e.code in (0, None):
            sys.stdout.write(out.getvalue())
            raise
        text = err.getvalue() + out.getvalue()
        lines = [re.sub(r"^[\s│╭╰├|+]+|[\s│╮╯┤|+]+$", "", ln) for ln in text.splitlines()]
        lines = [ln for ln in lines if ln and not set(ln) <= set("─━-=+ ")]
        # tyro prints a titled box: the title ("Value error"), then the message, then help text
        first = lines[1] if len(lines) > 1 else (lines[0] if lines else "invalid arguments")
        first = re.sub(r"^Error parsing (run|algo): ", "", first)
        raise UserInputError(f"{first.rstrip('.')}: see `{prog} --help` for the expected flags and types") from None


def _pop_value(args: list[str], flag: str) -> str | None:
    for i, tok in enumerate(args):
        if tok == flag and i + 1 < len(args):
            return args[i + 1]
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


def _given(args: list[str]) -> set[str]:
    out = set()
    for tok in args:
        if tok.startswith("--"):
            name = tok[2:].split("=", 1)[0].replace("-", "_")
            out.add(name[3:] if name.startswith("no_") else name)
    return out


# -- train ----------------------------------------------------------------------------------------------
def cmd_train(args: list[str]) -> int:
    from ctrl_rl.config import ALGO_CONFIGS, ALGO_RUN_DEFAULTS, from_dict, load_config, load_preset

    if not args or args[0] in ("-h", "--help"):
        print(f"usage: ctrl-rl train ALGO [flags]   (ALGO one of {sorted(ALGO_CONFIGS)}; `ctrl-rl train ppo --help` lists the flags)")
        return 0 if args else 2
    algo, rest = args[0], args[1:]
    if algo not in ALGO_CONFIGS:
        import difflib

        close = difflib.get_close_matches(algo, ALGO_CONFIGS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UserInputError(f"unknown algorithm {algo!r}{hint}: expected one of {sorted(ALGO_CONFIGS)}")
    cfg_cls = ALGO_CONFIGS[algo]
    prog = f"ctrl-rl train {algo}"
    _check_flags(rest, _flag_names(RunConfig, cfg_cls), prog)

    resume_dir = _pop_value(rest, "--resume")
    if resume_dir is not None:
        run_dir = Path(resume_dir)
        if not (run_dir / "config.json").is_file():
            raise UserInputError(f"resume directory {resume_dir!r} has no config.json: expected a run directory written by `ctrl-rl train`")
        saved_algo, run0, cfg0 = load_config(run_dir / "config.json")
        if saved_algo != algo:
            raise UserInputError(f"resume directory {resume_dir!r} holds a {saved_algo!r} run: expected a {algo!r} run")
        from ctrl_rl.learn.checkpoint import load_checkpoint

        load_checkpoint(run_dir / "checkpoints" / "latest.pt", expect_algo=algo)  # validate before anything else
        extra = _given(rest) - RESUME_OVERRIDES
        if extra:
            raise UserInputError(f"--{sorted(extra)[0].replace('_', '-')} cannot change when resuming: expected only "
                                 f"{', '.join('--' + o.replace('_', '-') for o in sorted(RESUME_OVERRIDES))}")
        parsed = _tyro_parse(TrainArgs[cfg_cls], rest, TrainArgs(run0, cfg0), prog)
        run = dataclasses.replace(run0, total_steps=parsed.run.total_steps, progress=parsed.run.progress,
                                  threads=parsed.run.threads, collect_threads=parsed.run.collect_threads, log_every=parsed.run.log_every,
                                  checkpoint_every=parsed.run.checkpoint_every, save_replay=parsed.run.save_replay,
                                  resume=str(run_dir))
        return _run_training(algo, run, cfg0, run_dir, resume=True)

    preset_name = _pop_value(rest, "--preset")
    run_defaults: dict = dict(ALGO_RUN_DEFAULTS.get(algo, {}))
    cfg_defaults: dict = {}
    if preset_name is not None:
        preset = load_preset(preset_name)
        if preset.algo != algo:
            raise UserInputError(f"preset {preset_name!r} is for {preset.algo!r}: expected a preset for {algo!r}")
        run_defaults, cfg_defaults = {**run_defaults, **preset.run}, dict(preset.config)
        run_defaults["preset"] = preset_name
    elif not rest or all(not t.startswith("--env") for t in rest):
        from ctrl_rl.config import DEFAULT_PRESET

        if algo == DEFAULT_PRESET.algo:  # no env and no preset given: the embedded default
            run_defaults, cfg_defaults = dict(DEFAULT_PRESET.run), dict(DEFAULT_PRESET.config)
            run_defaults["preset"] = DEFAULT_PRESET.name
    run_d = from_dict(RunConfig, run_defaults, "preset run")
    cfg_d = from_dict(cfg_cls, cfg_defaults, f"preset {algo} config")
    parsed = _tyro_parse(TrainArgs[cfg_cls], rest, TrainArgs(run_d, cfg_d), prog)
    run, cfg = parsed.run, parsed.algo
    if run.scale_envs > 1 and algo != "ppo":
        raise UserInputError(f"--scale-envs applies to ppo only: expected no --scale-envs for {algo!r}")
    if run.scale_envs > 1:
        from ctrl_rl.algos.ppo import scale_envs

        n, cfg = scale_envs(run.num_envs, cfg, run.scale_envs)
        run = dataclasses.replace(run, num_envs=n, scale_envs=1)
    if run.run_dir is not None:
        run_dir = Path(run.run_dir)
        if (run_dir / "checkpoints" / "latest.pt").exists() or (run_dir / "config.json").exists():
            raise UserInputError(f"run directory {run.run_dir!r} already holds a run: expected a new directory, or --resume {run.run_dir}")
    else:
        safe_env = re.sub(r"[^A-Za-z0-9._-]+", "_", run.env)
        run_dir = Path("runs") / f"{algo}-{safe_env}-s{run.seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    return _run_training(algo, run, cfg, run_dir, resume=False)


def _run_training(algo: str, run, cfg, run_dir: Path, resume: bool) -> int:
    from ctrl_rl.learn import distributed as D
    from ctrl_rl.learn.onpolicy import train_onpolicy

    dist_info = D.init_from_env(run.device)
    if dist_info.enabled and algo in OFF_POLICY | OFFLINE:
        D.shutdown()
        raise UserInputError(f"{algo!r} runs in one process: expected `ctrl-rl train {algo}` without torchrun")
    try:
        if dist_info.enabled:
            import torch.distributed as dist

            obj = [str(run_dir)]
            dist.broadcast_object_list(obj, src=0)
            run_dir = Path(obj[0])
        if algo in OFF_POLICY:
            from ctrl_rl.learn.offpolicy import train_offpolicy

            res = train_offpolicy(run, algo, cfg, run_dir, resume=resume)
        elif algo in OFFLINE:
            from ctrl_rl.learn.offline import train_offline

            res = train_offline(run, algo, cfg, run_dir, resume=resume)
        else:
            res = train_onpolicy(run, cfg, run_dir, resume=resume, dist_info=dist_info)
        if dist_info.is_main:
            png = None
            try:
                from ctrl_rl.plot import plot_run

                png = plot_run(run_dir)
            except Exception as e:  # a plot must never fail a finished run
                print(f"ctrl-rl: could not draw the learning curve ({e})", file=sys.stderr)
            print(json.dumps({"run_dir": str(run_dir), "step": res.step, "episode_return": res.last_return,
                              "wall_time_s": round(res.wall_time, 1)}))
            print(f"run:         {run_dir}\ncheckpoint:  {run_dir / 'checkpoints' / 'latest.pt'}\n"
                  f"tensorboard: tensorboard --logdir {run_dir}\nplot:        {png}")
    finally:
        D.shutdown()
    return 0


# -- eval -----------------------------------------------------------------------------------------------
def cmd_eval(args: list[str]) -> int:
    from ctrl_rl.learn.evaluate import EvalOptions, evaluate_checkpoint

    prog = "ctrl-rl eval"
    if not args or args[0] in ("-h", "--help"):
        print("usage: ctrl-rl eval RUN_DIR_OR_CHECKPOINT [--episodes N] [--env ID] [--seed K] [--device cpu|cuda]")
        return 0 if args else 2
    path, rest = args[0], args[1:]
    _check_flags(rest, _flag_names(EvalOptions), prog)
    opts = _tyro_parse(EvalOptions, rest, EvalOptions(), prog)
    print(json.dumps(evaluate_checkpoint(path, opts)))
    return 0


# -- data -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataInfoOptions:
    env: str | None = None
    """Env whose reference scores normalize the returns (default: the dataset's own record, or its name)."""
    refs: str | None = None
    """Reference table: d4rl (the frozen D4RL min/max), local (measured v5 references) or a JSON path
    (default: the dataset's own record when it has one, else d4rl)."""


@dataclass(frozen=True)
class DataGenerateOptions:
    env: str = ""
    """Gymnasium MuJoCo v5 task with shipped behaviour policies: Hopper-v5, HalfCheetah-v5 or Walker2d-v5."""
    level: str = ""
    """random, medium, expert, medium-expert, medium-replay, or all (every level, in that order)."""
    steps: int = 1_000_000
    """Transitions per random/medium/expert dataset (medium-expert: per part; medium-replay: the manifest's
    medium step)."""
    seed: int = 0
    """Seed of the action sampling; env i is reset with seed + i."""
    num_envs: int = 32
    """Envs stepped in lockstep with one batched policy forward pass (the data depend on it; it is recorded)."""
    workers: int = 0
    """Processes stepping the envs (0: one per core); the data do not depend on it."""
    out: str | None = None
    """Output file (one level) or directory (all; medium-expert's parts go next to it). Default: the dataset
    cache ($CTRL_RL_DATA_DIR, else $XDG_CACHE_HOME/ctrl_rl/datasets, else ~/.cache/ctrl_rl/datasets)."""
    force: bool = False
    """Regenerate files that already exist (otherwise reused when the same request made them)."""
    from_run: str | None = None
    """medium-replay: the behaviour-training run directory (trained with --save-replay) to read the replay from,
    instead of re-running the recorded training."""
    progress: bool = True
    """Show a progress bar."""


DATA_USAGE = ("usage: ctrl-rl data info PATH_OR_ID [--env ID] [--refs d4rl|local|PATH]\n"
              "       ctrl-rl data generate --env ID --level LEVEL [--steps N] [--seed K] [--num-envs N] [--workers W] "
              "[--out PATH] [--force] [--from-run DIR]   (`ctrl-rl data generate --help` explains them)")


def cmd_data(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help") or (args[0] == "info" and (len(args) < 2 or args[1] in ("-h", "--help"))):
        print(DATA_USAGE)
        return 0 if args else 2
    if args[0] == "generate":
        return cmd_data_generate(args[1:])
    if args[0] != "info":
        raise UserInputError(f"unknown `ctrl-rl data` command {args[0]!r}: expected info or generate")
    prog = "ctrl-rl data info"
    path, rest = args[1], args[2:]
    _check_flags(rest, _flag_names(DataInfoOptions), prog)
    opts = _tyro_parse(DataInfoOptions, rest, DataInfoOptions(), prog)
    print(json.dumps(dataset_info(path, opts)))
    return 0


def cmd_data_generate(args: list[str]) -> int:
    """D4RL-protocol datasets (ctrl_rl.storage.datasets.generate): every input is checked before anything is
    written; one JSON line per dataset (path, transitions, episodes, return mean, normalized score, seconds)."""
    from ctrl_rl.storage.datasets.generate import plan, run_jobs

    prog = "ctrl-rl data generate"
    _check_flags(args, _flag_names(DataGenerateOptions), prog)
    opts = _tyro_parse(DataGenerateOptions, args, DataGenerateOptions(), prog)
    if not opts.env or not opts.level:
        raise UserInputError(f"`{prog}` needs --env and --level: expected e.g. --env Hopper-v5 --level medium")
    if opts.workers < 0:
        raise UserInputError(f"invalid --workers {opts.workers}: expected 0 (one per core) or a positive integer")
    jobs = plan(opts.env, opts.level, opts.steps, opts.seed, opts.num_envs, opts.out, opts.force, opts.from_run)
    for summary in run_jobs(jobs, opts.progress, opts.workers or None):
        print(json.dumps(summary), flush=True)
    return 0


def dataset_info(path: str, opts: DataInfoOptions) -> dict:
    """Size, episodes, return statistics and the normalized score of a dataset's own episodes."""
    from ctrl_rl.storage.datasets import load_dataset
    from ctrl_rl.storage.datasets.generate import resolve_dataset_id
    from ctrl_rl.storage.datasets.scores import normalized_score, normalized_score_from

    # whole episodes: the trajectory view of a file (Minari datasets have only that view); a generated
    # dataset id (hopper-medium-v5) is its file in the dataset cache
    file = Path(path) if Path(path).is_file() else resolve_dataset_id(path)
    ds = load_dataset(file or path, view="trajectory" if file is not None else None)
    # statistics over complete episodes (ending in a terminal or a time-out), as `data generate` reports them;
    # a fragment cut off by the end of the data (or a layout without time-outs) is counted apart
    returns = ds.episode_returns()  # [K] float64
    complete = (ds.terminated | ds.truncated)[ds.episode_offsets[1:] - 1]  # [K] bool
    n_complete = int(complete.sum())
    if n_complete:
        returns = returns[complete]
    meta = ds.metadata
    env = opts.env or meta.get("env_id") or Path(path).stem
    info = {"dataset": path, "format": meta.get("format"), "env": env, "transitions": len(ds),
            "episodes": n_complete, "incomplete_episodes": ds.num_episodes - n_complete,
            "returns_over": "complete episodes" if n_complete else "incomplete episodes (no episode is complete)",
            "terminals": int(ds.terminated.sum()), "timeouts": int(ds.truncated.sum()),
            "obs_dim": ds.obs_dim, "action_dim": ds.action_dim,
            "return_mean": float(returns.mean()), "return_std": float(returns.std(unbiased=False)),
            "return_min": float(returns.min()), "return_max": float(returns.max())}
    try:
        if opts.env is None and opts.refs is None and meta.get("ref_scores"):
            score, source = normalized_score_from(meta["ref_scores"], float(returns.mean()))
        else:
            score, source = normalized_score(env, float(returns.mean()), opts.refs or "d4rl")
        info.update(normalized_score=float(score), score_reference=source)
    except UserInputError as e:  # the size and returns are still worth printing
        info.update(normalized_score=None, score_reference=str(e))
    return info


# -- plot -----------------------------------------------------------------------------------------------
def cmd_plot(args: list[str]) -> int:
    from ctrl_rl.plot import plot_run

    if not args or args[0] in ("-h", "--help"):
        print("usage: ctrl-rl plot RUN_DIR [--out PNG]")
        return 0 if args else 2
    run_dir, rest = args[0], args[1:]
    _check_flags(rest, {"--out", "-h", "--help"}, "ctrl-rl plot")
    out = _pop_value(rest, "--out")
    print(plot_run(Path(run_dir), Path(out) if out else None))
    return 0


# -- list -----------------------------------------------------------------------------------------------
def cmd_list(args: list[str]) -> int:
    what = args[0] if args else None
    if what not in ("envs", "algos", "presets"):
        raise UserInputError(f"`ctrl-rl list` takes one of envs, algos, presets: got {what!r}")
    if what == "envs":
        from ctrl_rl.envs.registry import list_envs

        for e in list_envs():
            print(e)
    elif what == "algos":
        for name, desc in ALGOS.items():
            print(f"{name:10s} {desc}")
    else:
        from ctrl_rl.config import list_presets

        presets = list_presets()
        width = max(len(n) for n in presets)
        for name, p in presets.items():
            print(f"{name:{width}s}  {p.algo:6s} {p.description}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
