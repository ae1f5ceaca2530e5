"""Data generation: D4RL-protocol datasets regenerated on Gymnasium MuJoCo v5 (``ctrl-rl data generate``).

An application layer above ``learn``: ``behaviour`` loads and exports the shipped SAC behaviour policies
(``ctrl_rl/data/behaviour/``) and their manifest; ``generate`` rolls them out in worker processes, stitches
medium-expert and rebuilds medium-replay (re-running the behaviour training through ``ctrl_rl.learn``). Reading,
writing, caching and scoring the files is ``ctrl_rl.storage.datasets``'s job, which never imports this package.

Nothing is imported here, so ``import ctrl_rl.datagen`` stays cheap; use ``ctrl_rl.datagen.generate`` and
``ctrl_rl.datagen.behaviour``.
"""
