"""The `ctrl-rl` command line: train, eval, export, deploy, serve, data, plot, list.

    ctrl-rl train ALGO --env ID [--num-envs N] [--total-steps S] [--seed K] [--run-dir DIR] [--preset NAME]
                       [--device cpu|cuda] [--resume DIR] [every loop setting and hyperparameter of the algorithm]
    ctrl-rl train --preset NAME [flags]               (the algorithm the preset names, e.g. fastsac-halfcheetah)
    ctrl-rl train iql|cql|calql|sac ... --seeds 0 1 2 [--run-dir DIR] ...   (several seeds in one process,
                       batched networks, one run directory per seed under DIR; --resume DIR continues them all)
    ctrl-rl train ALGO --dataset LEROBOT_DIR [--robot NAME] ...   (no --env: real-robot data, the robot's spec from
                       the dataset's robot_type or --robot, no simulator and no evaluation)
    ctrl-rl eval RUN_DIR_OR_CHECKPOINT [--episodes N] [--env ID] [--seed K]
    ctrl-rl export RUN_DIR_OR_CHECKPOINT [--format onnx pt2] [--out DIR]
    ctrl-rl deploy EXPORT_DIR --sim ENV_ID [--episodes N] [--rate HZ] [--log FILE] [--server HOST:PORT]
    ctrl-rl serve EXPORT_DIR [--host 127.0.0.1] [--port 50051] [--token T]
    ctrl-rl data info PATH_OR_ID [--env ID] [--refs d4rl|local|PATH]
    ctrl-rl data generate --env Hopper-v5|HalfCheetah-v5|Walker2d-v5
                          --level random|medium|expert|medium-expert|medium-replay|all
    ctrl-rl data generate --env manip:Lift --level scripted --format lerobot [--episodes N] [--noise X] [--out DIR]
                          [--steps N] [--seed K] [--num-envs N] [--workers W] [--out PATH] [--force] [--from-run DIR]
    ctrl-rl plot RUN_DIR [--out PNG]
    ctrl-rl list envs|algos|presets                 (algos: every registered algorithm, its regime and summary)

Flags of `train` come from the typed config dataclasses through tyro. Bad input (unknown env, algo,
preset or flag, invalid values, missing or broken run directories and checkpoints) prints one sentence
to stderr and exits with code 2 before anything is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Generic, Literal, TypeVar

import tyro

import ctrl_rl.core.perf  # noqa: F401  (first: the thread governor's first window covers the imports)
from ctrl_rl.errors import UserInputError, did_you_mean
from ctrl_rl.learn.config import RunConfig

assert __doc__ is not None  # the module docstring holds the usage text
USAGE = __doc__.split("\n\n")[1]
C = TypeVar("C")
T = TypeVar("T")

L = TypeVar("L")


@dataclass(frozen=True)
class TrainArgs(Generic[L, C]):
    """RunConfig, the loop's config and the algorithm's config, flattened into one flag namespace."""

    run: Annotated[RunConfig, tyro.conf.OmitArgPrefixes]
    loop: Annotated[L, tyro.conf.OmitArgPrefixes]
    algo: Annotated[C, tyro.conf.OmitArgPrefixes]


# flags that may change when resuming (run fields, then loop fields)
RESUME_RUN = ("total_steps", "progress", "threads", "log_every", "checkpoint_every", "resume")
RESUME_LOOP = frozenset({"collect_threads", "save_replay", "keep_every"})
RESUME_OVERRIDES = set(RESUME_RUN) | set(RESUME_LOOP)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from ctrl_rl.learn.actor_learner import ActorsLost
    from ctrl_rl.learn.runtime import TrainingDiverged

    try:
        return _dispatch(argv)
    except UserInputError as e:
        # one sentence on one line, whatever the width of the terminal or the pipe it goes to
        sentence = re.sub(r"\s*[\r\n]+\s*", " ", str(e).strip())
        print(f"ctrl-rl: error: {sentence}", file=sys.stderr, flush=True)
        return 2
    except (TrainingDiverged, ActorsLost) as e:
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
    commands = {"train": cmd_train, "eval": cmd_eval, "export": cmd_export, "deploy": cmd_deploy, "serve": cmd_serve,
                "data": cmd_data, "plot": cmd_plot, "list": cmd_list}
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
    for tok in args:
        if tok.startswith("-") and not re.fullmatch(r"-\d.*|-\.\d.*|-inf|-nan", tok):
            name = tok.split("=", 1)[0]
            if name not in valid:
                raise UserInputError(f"unknown flag {name!r} for `{command}`{did_you_mean(name, valid)}: see "
                                     f"`{command} --help` for the flags it takes")


def _tyro_parse(cls: type[T], args: list[str], default: T, prog: str) -> T:
    """Run tyro, turning its boxed error into one sentence (UserInputError) and passing --help through.

    tyro draws its error in a box as wide as the terminal (80 columns when piped) and wraps the message
    inside it, even in the middle of a value. On an error, the parse is therefore run again with a very
    wide ``COLUMNS`` (which tyro's formatter reads through shutil.get_terminal_size), so the message is
    one line of the box and becomes the sentence whole; --help keeps the real width."""
    import os

    def parse(columns: str | None) -> tuple[T, None, str] | tuple[None, SystemExit, str]:
        out, err = io.StringIO(), io.StringIO()
        saved = os.environ.get("COLUMNS")
        if columns is not None:
            os.environ["COLUMNS"] = columns
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                return tyro.cli(cls, args=args, default=default, prog=prog), None, ""
        except SystemExit as e:
            return None, e, err.getvalue() + out.getvalue()
        finally:
            if columns is not None:
                if saved is None:
                    os.environ.pop("COLUMNS", None)
                else:
                    os.environ["COLUMNS"] = saved

    first = parse(None)
    if first[1] is None:
        return first[0]
    _, exit_, text = first
    if exit_.code in (0, None):  # --help: tyro's text as the user's terminal shows it
        sys.stdout.write(text)
        raise exit_
    _, again, wide = parse("100000")
    if again is not None and wide.strip():
        text = wide
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    # box lines stripped of their frame; rules (hr) become empty lines that separate the box's parts:
    # the title ("Value error"), the message, then argument help and the --help hint
    # (with stdout captured, tyro draws no frame and its rules are ASCII dashes)
    lines = [ln.strip(" \t│╭╮╰╯├┤─━") for ln in text.splitlines()]
    lines = ["" if set(ln) <= set("-=+ ") else ln for ln in lines]
    parts: list[list[str]] = [[]]
    for ln in lines:
        if ln:
            parts[-1].append(ln)
        elif parts[-1]:
            parts.append([])
    parts = [p for p in parts if p]
    message = " ".join(parts[1] if len(parts) > 1 else (parts[0] if parts else ["invalid arguments"]))
    message = re.sub(r"^Error parsing (run|algo): ", "", message)
    raise UserInputError(f"{message.rstrip('.')}: see `{prog} --help` for the expected flags and types") from None


def _pop_value(args: list[str], flag: str) -> str | None:
    for i, tok in enumerate(args):
        if tok == flag and i + 1 < len(args):
            return args[i + 1]
        if tok.startswith(flag + "="):
            return tok.split("=", 1)[1]
    return None


SEEDS_HELP = """
--seeds K1 K2 ...
    Train one run per seed in this one process, the seeds' networks batched
    (IQL, CQL, Cal-QL on --dataset; SAC online, each seed with its own envs and
    replay): --run-dir DIR (default runs/ALGO-ENV-seedsK1_K2_...-TIME) holds
    seeds.json and one complete run directory per seed, DIR/seed_K, equal bit
    for bit at a fixed --threads to the run --seed K alone.
    --resume DIR continues every seed. Not together with --seed."""


def _pop_seeds(args: list[str]) -> tuple[list[str], list[int] | None]:
    """``--seeds K1 K2 ...`` taken out of ``args`` (the seeds, or None when the flag is absent)."""
    names = [i for i, t in enumerate(args) if t == "--seeds" or t.startswith("--seeds=")]
    if not names:
        return args, None
    if len(names) > 1:
        raise UserInputError("--seeds was given twice: expected one --seeds K1 K2 ...")
    i = names[0]
    tokens = [args[i].split("=", 1)[1]] if "=" in args[i] else []
    j = i + 1
    while j < len(args) and not args[j].startswith("--"):
        tokens.append(args[j])
        j += 1
    values = [v for t in tokens for v in t.replace(",", " ").split()]
    try:
        seeds = [int(v) for v in values]
    except ValueError:
        raise UserInputError(f"--seeds got {' '.join(values)!r}: expected whole numbers, e.g. --seeds 0 1 2") from None
    if not seeds:
        raise UserInputError("--seeds got no seed: expected two or more seeds, e.g. --seeds 0 1 2")
    return args[:i] + args[j:], seeds


def _given(args: list[str]) -> set[str]:
    out = set()
    for tok in args:
        if tok.startswith("--"):
            name = tok[2:].split("=", 1)[0].replace("-", "_")
            out.add(name[3:] if name.startswith("no_") else name)
    return out


# -- train ----------------------------------------------------------------------------------------------
def cmd_train(args: list[str]) -> int:
    from ctrl_rl.algos import registry
    from ctrl_rl.learn.config import build_run, from_dict, load_preset, loop_config_class

    if not args or args[0] in ("-h", "--help"):
        print(f"usage: ctrl-rl train ALGO [flags]   (ALGO one of {registry.names()}; `ctrl-rl train ppo --help` "
              "lists the flags; `ctrl-rl list algos` says what each is)")
        return 0 if args else 2
    if args[0].startswith("-") and (named := _pop_value(args, "--preset")) is not None:
        args = [load_preset(named).algo, *args]  # `ctrl-rl train --preset NAME ...`: the preset names its algorithm
    algo, rest = args[0], args[1:]
    method = _pop_value(rest, "--method")  # a family once chose its method by flag; each is now an algorithm
    if method is not None and algo not in registry.names() and f"{algo}_{method}" in registry.names():
        raise UserInputError(f"`ctrl-rl train {algo} --method {method}` is now `ctrl-rl train {algo}_{method}`: "
                             "expected the method in the algorithm's name (`ctrl-rl list algos` lists them)")
    entry = registry.get(algo)
    cfg_cls, loop_cls = entry.config, loop_config_class(entry.regime, entry.collector)
    prog = f"ctrl-rl train {algo}"
    if "trace_lambda" in {f.name for f in dataclasses.fields(cfg_cls)}:  # --lambda: `lambda` is a Python keyword
        rest = ["--trace-lambda" + a[len("--lambda"):] if a == "--lambda" or a.startswith("--lambda=") else a
                for a in rest]
    robot = _pop_value(rest, "--robot")  # a LeRobot dataset's robot when it trains without --env
    rest = [t for i, t in enumerate(rest) if not (t == "--robot" or t.startswith("--robot=")
                                                   or (i > 0 and rest[i - 1] == "--robot"))]
    rest, seeds = _pop_seeds(rest)
    if seeds is not None:
        if entry.seed_layout is None:
            from ctrl_rl.learn.seeds import check_seeds

            check_seeds(seeds, entry, None)  # one sentence naming the algorithms that take --seeds
        if "seed" in _given(rest):
            raise UserInputError("--seeds and --seed were both given: expected --seeds K1 K2 ... for several seeds in "
                                 "one process, or --seed K for one")
    _check_flags(rest, _flag_names(RunConfig, loop_cls, cfg_cls), prog)

    resume_dir = _pop_value(rest, "--resume")
    if resume_dir is not None and robot is not None:
        raise UserInputError("--robot cannot change when resuming: expected the resumed run's own robot")
    if resume_dir is not None and seeds is not None:
        raise UserInputError(f"--seeds cannot be given with --resume: the seeds-run {resume_dir!r} names its seeds in "
                             "its seeds.json")
    if resume_dir is not None:
        from ctrl_rl.learn.seeds import read_record, seed_dir

        record = read_record(Path(resume_dir))
        if record is None:
            run, cfg0 = _resumed(algo, Path(resume_dir), rest, loop_cls, cfg_cls, prog)
            return _run_training(algo, run, cfg0, Path(resume_dir), resume=True, restartable=False)
        if record["algo"] != algo:
            raise UserInputError(f"resume directory {resume_dir!r} holds a seeds-run of {record['algo']!r}: expected "
                                 f"a {algo!r} run")
        resumed = [_resumed(algo, seed_dir(Path(resume_dir), s), rest, loop_cls, cfg_cls, prog)
                   for s in record["seeds"]]
        return _run_seeds(algo, [r for r, _ in resumed], resumed[0][1], Path(resume_dir), resume=True)

    preset_name = _pop_value(rest, "--preset")
    run_defaults: dict = dict(entry.run_defaults)
    loop_defaults: dict = dict(entry.loop_defaults)
    cfg_defaults: dict = dict(entry.config_defaults)
    if preset_name is not None:
        preset = load_preset(preset_name)
        if preset.algo != algo:
            raise UserInputError(f"preset {preset_name!r} is for {preset.algo!r}: expected a preset for {algo!r}")
        run_defaults.update(preset.run)
        loop_defaults.update(preset.loop)
        cfg_defaults.update(preset.config)
        run_defaults["preset"] = preset_name
    elif not rest or all(not t.startswith("--env") for t in rest):
        from ctrl_rl.learn.config import default_preset

        default = default_preset()
        if algo == default.algo:  # no env and no preset given: the embedded default
            run_defaults.update(default.run)
            loop_defaults.update(default.loop)
            cfg_defaults.update(default.config)
            run_defaults["preset"] = default.name
    run_d = build_run(entry, run_defaults, loop_defaults, "preset run")
    cfg_d = from_dict(cfg_cls, cfg_defaults, f"preset {algo} config")
    try:
        parsed = _tyro_parse(TrainArgs[loop_cls, cfg_cls], rest, TrainArgs(run_d, run_d.loop, cfg_d), prog)
    except SystemExit:
        if entry.seed_layout is not None:  # --help: the one flag outside the config classes
            print(SEEDS_HELP)
        raise
    run, cfg = dataclasses.replace(parsed.run, loop=parsed.loop), parsed.algo
    if run.dataset is not None and "env" not in _given(rest) and "env" not in run_defaults:
        run = dataclasses.replace(run, env=_env_of_dataset(run.dataset, robot))
    elif robot is not None:
        raise UserInputError(f"--robot {robot} names the robot of a LeRobot --dataset trained on without a "
                             "simulator: expected --dataset DIR and no --env (an env brings its own robot)")
    if run.scale_envs > 1:
        if entry.scale_envs is None:
            raise UserInputError("--scale-envs applies to algorithms with a co-scaling rule (ppo): "
                                 f"expected no --scale-envs for {algo!r}")
        n, cfg = entry.scale_envs(run.num_envs, cfg, run.scale_envs)
        run = dataclasses.replace(run, num_envs=n, scale_envs=1)
    if run.run_dir is not None:
        run_dir = Path(run.run_dir)
    else:
        safe_env = re.sub(r"[^A-Za-z0-9._-]+", "_", run.env)
        which = f"s{run.seed}" if seeds is None else "seeds" + "_".join(map(str, seeds))
        run_dir = Path("runs") / f"{algo}-{safe_env}-{which}-{time.strftime('%Y%m%d-%H%M%S')}"
    from ctrl_rl.learn.rundir import check_new_run_dir

    if seeds is not None:
        from ctrl_rl.learn.seeds import check_seeds, seed_runs

        check_seeds(seeds, entry, cfg)
        restart = _unstarted_seeds_run(algo, run_dir, seeds)
        if not restart:
            check_new_run_dir(run_dir)  # a file, unwritable: refused
        runs = seed_runs(run, run_dir, seeds)
        return _run_seeds(algo, runs, cfg, run_dir, resume=False, restart=restart)

    restartable = check_new_run_dir(run_dir)  # a file, unwritable, unrelated files, a run with a checkpoint: refused
    return _run_training(algo, run, cfg, run_dir, resume=False, restartable=restartable)


def _resumed(algo: str, run_dir: Path, rest: list[str], loop_cls: type, cfg_cls: type, prog: str):
    """The run and algorithm config a ``--resume run_dir`` continues with (the saved ones, with the flags that may
    change when resuming taken from ``rest``), after checking the directory and its checkpoint."""
    from ctrl_rl.learn.checkpoint import load_checkpoint
    from ctrl_rl.learn.config import load_config
    from ctrl_rl.learn.rundir import check_resume_dir

    resume_dir = str(run_dir)
    pre = run_dir / "pretrain" / "checkpoints" / "latest.pt"
    if ((run_dir / "config.json").is_file() and not (run_dir / "checkpoints" / "latest.pt").is_file()
            and pre.is_file()):
        ck_path = pre  # stopped inside the offline pre-training phase
    else:
        ck_path = check_resume_dir(run_dir)
    saved_algo, run0, cfg0 = load_config(run_dir / "config.json")
    if saved_algo != algo:
        raise UserInputError(f"resume directory {resume_dir!r} holds a {saved_algo!r} run: expected a {algo!r} run")
    ck = load_checkpoint(ck_path, expect_algo=algo)  # validate before anything else
    extra = _given(rest) - RESUME_OVERRIDES
    if extra:
        raise UserInputError(f"--{sorted(extra)[0].replace('_', '-')} cannot change when resuming: expected only "
                             f"{', '.join('--' + o.replace('_', '-') for o in sorted(RESUME_OVERRIDES))}")
    parsed = _tyro_parse(TrainArgs[loop_cls, cfg_cls], rest, TrainArgs(run0, run0.loop, cfg0), prog)
    done = int(ck.get("counters", {}).get("step", 0)) if ck_path.parent.parent == run_dir else 0
    if parsed.run.total_steps < done:
        raise UserInputError(f"--total-steps {parsed.run.total_steps} is below the {done} steps {resume_dir!r} has "
                             f"already done: expected --total-steps >= {done}")
    assert run0.loop is not None  # a saved run's config is built with its loop config (build_run)
    overridable = RESUME_LOOP & {f.name for f in dataclasses.fields(run0.loop)}
    loop = dataclasses.replace(run0.loop, **{k: getattr(parsed.loop, k) for k in overridable})
    run = dataclasses.replace(run0, **{k: getattr(parsed.run, k) for k in RESUME_RUN if k != "resume"},
                              resume=resume_dir, loop=loop)
    return run, cfg0


def _env_of_dataset(dataset: str, robot: str | None = None) -> str:
    """The env a dataset was recorded in (its record, Minari spec or D4RL file name), for runs without --env; for a
    LeRobot dataset (real-robot data) the robot's spec without a simulator, ``robot:<name>``."""
    from ctrl_rl.storage.datasets import infer_env_id
    from ctrl_rl.storage.datasets.envdata import robot_of_dataset
    from ctrl_rl.storage.datasets.loader import is_lerobot

    if is_lerobot(dataset):
        return robot_of_dataset(dataset, robot)
    if robot is not None:
        raise UserInputError(f"--robot {robot} applies to a LeRobot dataset (a directory holding meta/info.json): "
                             f"expected --env ID for the dataset {dataset!r}")
    env = infer_env_id(dataset)
    if env is None:
        raise UserInputError(f"--env is needed: the dataset {dataset!r} does not name the env it was recorded in "
                             "(expected --env ID, e.g. --env Hopper-v5)")
    return env


def _first_missing(path: Path) -> Path | None:
    """The outermost directory of ``path`` that does not exist yet (removed again if the run is refused)."""
    missing = None
    for p in [path, *path.absolute().parents]:
        if p.exists():
            break
        missing = p
    return missing


def _run_training(algo: str, run, cfg, run_dir: Path, resume: bool, restartable: bool) -> int:
    from ctrl_rl.learn import distributed as D
    from ctrl_rl.learn.checkpoint import remove_stale_tmp
    from ctrl_rl.learn.rundir import RunDirLock, clear_unstarted_run
    from ctrl_rl.learn.train import train

    dist_info = D.init_from_env(run.device)
    lock = None
    created = _first_missing(Path(run_dir))
    try:
        if dist_info.enabled:
            import torch.distributed as dist

            obj = [str(run_dir)]
            dist.broadcast_object_list(obj, src=0)
            run_dir = Path(obj[0])
        if dist_info.is_main:  # one process per run directory (rank 0 under torchrun)
            lock = RunDirLock(run_dir)
            lock.acquire()
            if restartable:
                removed = clear_unstarted_run(run_dir)
                print(f"ctrl-rl: {str(run_dir)!r} held a run stopped before its first checkpoint; restarting it "
                      f"(removed {', '.join(removed)})", file=sys.stderr)
            remove_stale_tmp(run_dir, all_pids=True)
            remove_stale_tmp(run_dir / "checkpoints", all_pids=True)
        try:
            res = train(run, algo, cfg, run_dir, resume=resume, dist_info=dist_info)
        except UserInputError:
            if lock is not None:
                lock.release()
                lock = None
            if created is not None and not (Path(run_dir) / "config.json").exists():
                import shutil

                shutil.rmtree(created, ignore_errors=True)  # refused before anything was written: leave nothing
            raise
        if dist_info.is_main:
            png = _report_run(run_dir, res)
            print(f"run:         {run_dir}\ncheckpoint:  {run_dir / 'checkpoints' / 'latest.pt'}\n"
                  f"tensorboard: tensorboard --logdir {run_dir}\nplot:        {png}")
    finally:
        if lock is not None:
            lock.release()
        D.shutdown()
    return 0


def _report_run(run_dir: Path, res) -> Path | None:
    """A finished run's learning-curve PNG (None where it could not be drawn: a plot never fails a run) and its
    one-line JSON summary on stdout."""
    png = None
    try:
        from ctrl_rl.plot import plot_run

        png = plot_run(run_dir)
    except Exception as e:  # a plot must never fail a finished run
        print(f"ctrl-rl: could not draw the learning curve of {run_dir} ({e})", file=sys.stderr)
    ret = res.last_return if math.isfinite(res.last_return) else None  # no episode ended yet: null, not NaN
    print(json.dumps({"run_dir": str(run_dir), "step": res.step, "episode_return": ret,
                      "wall_time_s": round(res.wall_time, 1)}))
    return png


def _unstarted_seeds_run(algo: str, parent: Path, seeds: list[int]) -> bool:
    """Whether ``parent`` (which ``check_new_run_dir`` accepted) holds the same seeds-run stopped before any seed's
    first checkpoint, to be restarted; False for a new or empty directory; else one sentence."""
    from ctrl_rl.learn.rundir import check_new_run_dir
    from ctrl_rl.learn.seeds import RECORD, read_record, seed_dir

    if not parent.is_dir() or not any(parent.iterdir()):
        return False  # new, empty, or a file (check_new_run_dir says so)
    record = read_record(parent)
    names = {seed_dir(Path("."), s).name for s in seeds} | {RECORD}
    if record is None or record != {"algo": algo, "seeds": list(seeds)} or \
            any(p.name not in names for p in parent.iterdir()):
        raise UserInputError(f"run directory {str(parent)!r} exists and is not empty: expected a new or empty "
                             "directory for a seeds-run (or the same seeds-run stopped before its first checkpoint)")
    for s in seeds:
        d = seed_dir(parent, s)
        if (d / "checkpoints" / "latest.pt").is_file():
            raise UserInputError(f"run directory {str(parent)!r} already holds a seeds-run with checkpoints: expected "
                                 f"a new directory, or --resume {parent} to continue it")
        check_new_run_dir(d)  # files ctrl_rl did not write, a seed in use: refused
    return True


def _run_seeds(algo: str, runs: list, cfg, parent: Path, resume: bool, restart: bool = False) -> int:
    """``_run_training`` for a seeds-run: every seed's directory locked, ``seeds.json`` written, the seeds trained in
    this process (``learn.train.train_seeds``); refused input leaves nothing behind."""
    from ctrl_rl.learn import distributed as D
    from ctrl_rl.learn.checkpoint import remove_stale_tmp
    from ctrl_rl.learn.rundir import RunDirLock, clear_unstarted_run
    from ctrl_rl.learn.seeds import write_record
    from ctrl_rl.learn.train import train_seeds

    if D.init_from_env(runs[0].device).enabled:
        raise UserInputError(f"--seeds trains its seeds in one process: expected `ctrl-rl train {algo} --seeds ...` "
                             "without torchrun")
    created = _first_missing(parent)
    dirs = [Path(r.run_dir) for r in runs]
    locks: list = []
    try:
        for d in dirs:
            lock = RunDirLock(d)
            lock.acquire()
            locks.append(lock)
            if restart:
                clear_unstarted_run(d)
            remove_stale_tmp(d, all_pids=True)
            remove_stale_tmp(d / "checkpoints", all_pids=True)
        if restart:
            print(f"ctrl-rl: {str(parent)!r} held a seeds-run stopped before its first checkpoint; restarting it",
                  file=sys.stderr)
        if not resume:
            write_record(parent, algo, [r.seed for r in runs])
        try:
            results = train_seeds(runs, algo, cfg, dirs, resume=resume)
        except UserInputError:
            for lock in locks:
                lock.release()
            locks = []
            if created is not None and not any((d / "config.json").exists() for d in dirs):
                import shutil

                shutil.rmtree(created, ignore_errors=True)  # refused before anything was written: leave nothing
            raise
        for d, res in zip(dirs, results):
            _report_run(d, res)
        print(f"seeds-run:   {parent} ({len(dirs)} seeds: {', '.join(d.name for d in dirs)})\n"
              f"tensorboard: tensorboard --logdir {parent}")
    finally:
        for lock in locks:
            lock.release()
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


def cmd_export(args: list[str]) -> int:
    from ctrl_rl.deploy.export import ExportOptions, export_run

    prog = "ctrl-rl export"
    if not args or args[0] in ("-h", "--help"):
        print("usage: ctrl-rl export RUN_DIR_OR_CHECKPOINT [--format onnx pt2] [--out DIR] [--batch B] [--seed K]\n"
              "  writes policy.onnx, policy.pt2 and policy.json (default: RUN_DIR/export) and checks each graph "
              "against the eager policy")
        return 0 if args else 2
    path, rest = args[0], args[1:]
    _check_flags(rest, _flag_names(ExportOptions), prog)
    opts = _tyro_parse(ExportOptions, rest, ExportOptions(), prog)
    meta = export_run(path, opts)
    print(json.dumps({"out": meta["out"], "algo": meta["algo"], "env": meta["env"], "files": meta["files"],
                      "parity": meta["parity"], "checkpoint_step": meta["checkpoint"]["step"]}))
    return 0


def cmd_deploy(args: list[str]) -> int:
    from ctrl_rl.deploy.runtime import DeployOptions, deploy_sim

    prog = "ctrl-rl deploy"
    if not args or args[0] in ("-h", "--help"):
        print("usage: ctrl-rl deploy EXPORT_DIR --sim ENV_ID [--episodes N] [--rate HZ] [--seed K] [--max-steps N]\n"
              "                      [--max-step-change X] [--max-obs-age S] [--max-misses K] [--log FILE]\n"
              "                      [--server HOST:PORT [--token T] [--timeout S] [--ask-ahead F] [--max-outage S]]\n"
              "  runs the exported policy (onnxruntime) through the safety filter and watchdog against the simulator "
              "and prints success rate, latency p50/p99, deadline misses and safety-filter interventions; with "
              "--server the actions come from `ctrl-rl serve` of the same export")
        return 0 if args else 2
    path, rest = args[0], args[1:]
    _check_flags(rest, _flag_names(DeployOptions), prog)
    opts = _tyro_parse(DeployOptions, rest, DeployOptions(sim="-"), prog)
    if opts.sim == "-":
        opts = dataclasses.replace(opts, sim="")  # raises the one-sentence error of a missing --sim
    print(json.dumps(deploy_sim(path, opts)))
    return 0


def cmd_serve(args: list[str]) -> int:
    from ctrl_rl.deploy.server import ServeOptions, serve

    prog = "ctrl-rl serve"
    if not args or args[0] in ("-h", "--help"):
        print("usage: ctrl-rl serve EXPORT_DIR [--host 127.0.0.1] [--port 50051] [--token T] [--max-batch B] "
              "[--workers W]\n"
              "  serves the export's actions over gRPC (ctrl_rl/deploy/policy.proto) until SIGINT or SIGTERM; "
              "prints one JSON line with the address; the token may come from $CTRL_RL_TOKEN")
        return 0 if args else 2
    path, rest = args[0], args[1:]
    _check_flags(rest, _flag_names(ServeOptions), prog)
    return serve(path, _tyro_parse(ServeOptions, rest, ServeOptions(), prog))


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
    format: Literal["hdf5", "lerobot"] = "hdf5"
    """hdf5 (the D4RL-protocol MuJoCo datasets) or lerobot (scripted manipulation demonstrations, --level scripted)."""
    episodes: int = 50
    """Scripted data: episodes to record."""
    noise: float = 0.0
    """Scripted data: std of Gaussian noise on the expert's actions (failed episodes are kept and marked)."""
    cameras: str = "all"
    """Scripted data: cameras to record (all, none, or names joined by +)."""
    image_size: str = "180x320"
    """Scripted data: H x W of the camera images."""
    randomize: bool = False
    """Scripted data: the task's domain randomisation."""
    mis_grasp: float = 0.0
    """Scripted data: fraction of episodes whose expert never closes the gripper (systematic failures, kept and
    marked)."""


DATA_USAGE = ("usage: ctrl-rl data info PATH_OR_ID [--env ID] [--refs d4rl|local|PATH]\n"
              "       ctrl-rl data generate --env ID --level LEVEL [--steps N] [--seed K] [--num-envs N] [--workers W] "
              "[--out PATH] [--force] [--from-run DIR]   (`ctrl-rl data generate --help` explains them)\n"
              "       ctrl-rl data generate --env manip:TASK --level scripted --format lerobot [--episodes N] "
              "[--noise X] [--mis-grasp F] [--cameras all] [--image-size 180x320] [--randomize] [--out DIR]")


def cmd_data(args: list[str]) -> int:
    if (not args or args[0] in ("-h", "--help")
            or (args[0] == "info" and (len(args) < 2 or args[1] in ("-h", "--help")))):
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
    """D4RL-protocol datasets (ctrl_rl.datagen.generate): every input, and every output path, is checked before
    anything is generated or written; one JSON line per dataset (path, transitions, episodes, return mean,
    normalized score, seconds)."""
    from ctrl_rl.datagen.generate import plan, run_jobs

    prog = "ctrl-rl data generate"
    _check_flags(args, _flag_names(DataGenerateOptions), prog)
    opts = _tyro_parse(DataGenerateOptions, args, DataGenerateOptions(), prog)
    if not opts.env or not opts.level:
        raise UserInputError(f"`{prog}` needs --env and --level: expected e.g. --env Hopper-v5 --level medium")
    if opts.env.startswith("manip:") or opts.level == "scripted" or opts.format == "lerobot":
        from ctrl_rl.datagen.scripted import ScriptedOptions, generate_scripted

        if opts.level != "scripted" or opts.format != "lerobot" or not opts.env.startswith("manip:"):
            raise UserInputError(f"--env {opts.env} --level {opts.level} --format {opts.format}: scripted "
                                 "demonstrations are recorded for the manipulation tasks in the LeRobot layout, "
                                 "expected --env manip:TASK --level scripted --format lerobot")
        n = opts.num_envs if any(a.startswith("--num-envs") or a.startswith("--num_envs") for a in args) else 4
        summary = generate_scripted(ScriptedOptions(opts.env, opts.episodes, opts.noise, opts.cameras, opts.image_size,
                                                    opts.seed, n, opts.randomize, opts.out, opts.force,
                                                    opts.mis_grasp), opts.progress)
        print(json.dumps(summary), flush=True)
        return 0
    if opts.workers < 0:
        raise UserInputError(f"invalid --workers {opts.workers}: expected 0 (one per core) or a positive integer")
    jobs = plan(opts.env, opts.level, opts.steps, opts.seed, opts.num_envs, opts.out, opts.force, opts.from_run)
    for summary in run_jobs(jobs, opts.progress, opts.workers or None):
        print(json.dumps(summary), flush=True)
    return 0


def dataset_info(path: str, opts: DataInfoOptions) -> dict:
    """Size, episodes, return statistics and the normalized score of a dataset's own episodes, and its sha256 (what
    a run that trains on it records in config.json). A dataset whose observation or action size is not that of
    ``--env`` (or of the env its record names, when that env can be made here) is refused."""
    from ctrl_rl.storage.datasets import check_env_fits, load_dataset
    from ctrl_rl.storage.datasets.cache import resolve_dataset_id
    from ctrl_rl.storage.datasets.loader import dataset_fingerprint, env_spec
    from ctrl_rl.storage.datasets.scores import normalized_score, normalized_score_from

    if (Path(path) / "meta" / "info.json").is_file():  # a LeRobot dataset: its own summary
        from ctrl_rl.storage.datasets.lerobot import lerobot_info

        info = lerobot_info(path)
        return {"dataset": path, "format": "lerobot", **{k: v for k, v in info.items() if k != "features"},
                "sha256": dataset_fingerprint(path)["sha256"]}
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
    if opts.env is not None:
        check_env_fits(ds, opts.env)
    elif meta.get("env_id"):
        try:
            spec = env_spec(meta["env_id"])
        except UserInputError:  # the recorded env cannot be made here (not installed): nothing to check against
            spec = None
        if spec is not None:
            check_env_fits(ds, meta["env_id"], spec)
    env = opts.env or meta.get("env_id") or Path(path).stem
    info = {"dataset": path, "format": meta.get("format"), "env": env, "transitions": len(ds),
            "episodes": n_complete, "incomplete_episodes": ds.num_episodes - n_complete,
            "returns_over": "complete episodes" if n_complete else "incomplete episodes (no episode is complete)",
            "terminals": int(ds.terminated.sum()), "timeouts": int(ds.truncated.sum()),
            "obs_dim": ds.obs_dim, "action_dim": ds.action_dim,
            "return_mean": float(returns.mean()), "return_std": float(returns.std(unbiased=False)),
            "return_min": float(returns.min()), "return_max": float(returns.max()),
            "sha256": dataset_fingerprint(file or path)["sha256"]}
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
    if run_dir.startswith("--out"):
        raise UserInputError(f"`ctrl-rl plot` got {run_dir!r} where the run directory goes: expected "
                             "`ctrl-rl plot RUN_DIR [--out FILE.png]`, the run directory first")
    _check_flags(rest, {"--out", "-h", "--help"}, "ctrl-rl plot")
    if "-h" in rest or "--help" in rest:
        print("usage: ctrl-rl plot RUN_DIR [--out PNG]   (or .pdf, .svg, ...: any format matplotlib writes)")
        return 0
    out = None
    i = 0
    while i < len(rest):  # only --out OUT / --out=OUT, once
        tok = rest[i]
        if tok.startswith("--out="):
            value, i = tok.split("=", 1)[1], i + 1
        elif tok == "--out" and i + 1 < len(rest):
            value, i = rest[i + 1], i + 2
        elif tok == "--out":
            raise UserInputError("--out needs a value: expected `ctrl-rl plot RUN_DIR --out FILE.png`")
        else:
            raise UserInputError(f"unexpected argument {tok!r} for `ctrl-rl plot`: "
                                 "expected `ctrl-rl plot RUN_DIR [--out FILE.png]`")
        if out is not None:
            raise UserInputError("--out is given twice: expected one output file for `ctrl-rl plot`")
        if not value:
            raise UserInputError("--out is empty: expected a file path such as learning_curve.png")
        out = value
    print(plot_run(Path(run_dir), Path(out) if out is not None else None))
    return 0


# -- list -----------------------------------------------------------------------------------------------
def cmd_list(args: list[str]) -> int:
    what = args[0] if args else None
    if what not in ("envs", "algos", "presets"):
        raise UserInputError(f"`ctrl-rl list` takes one of envs, algos, presets: got {what!r}")
    if what == "envs":
        from ctrl_rl.envs.registry import describe_env, list_envs

        for e in list_envs():
            label = describe_env(e)
            print(f"{e:48s} {label}" if label else e)
    elif what == "algos":
        from ctrl_rl.algos import registry

        entries = registry.entries()
        width, rwidth = max(len(e.name) for e in entries), max(len(e.regime) for e in entries)
        for e in entries:
            print(f"{e.name:{width}s}  {e.regime:{rwidth}s}  {e.summary}")
    else:
        from ctrl_rl.learn.config import list_presets

        presets = list_presets()
        width = max(len(n) for n in presets)
        for name, p in presets.items():
            print(f"{name:{width}s}  {p.algo:6s} {p.description}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
