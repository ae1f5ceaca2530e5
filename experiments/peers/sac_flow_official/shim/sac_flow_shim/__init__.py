"""What makes the official SAC Flow scripts run here unmodified (launch.py puts this folder on ``sys.path``).

record       JSON lines into ``$SAC_FLOW_SHIM_DIR`` (tensorboard.jsonl, wandb.jsonl, shim.jsonl)
tensorboard  a ``SummaryWriter`` stand-in that records what the scripts log
vector       ``SyncVectorEnv`` with Gymnasium 0.29's step API on Gymnasium 1.x; the env-step clock; the evaluation hook
evaluate     the deterministic evaluation (JAX, imported only when an evaluation runs)
"""
