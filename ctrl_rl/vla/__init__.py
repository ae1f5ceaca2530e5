"""Vision-language-action models and everything the VLA algorithms build on (layer 3: below the algorithms).

- ``backbones``: transformers vision-language models behind one adapter (tiny configs or a local directory);
- ``tokenizer``: an offline byte-level BPE tokenizer for the tiny backbones, or the directory's own;
- ``heads``: action normalisation and the three action heads (tokens, regression, flow);
- ``policy``: ``VLAPolicy``, the sequence images + instruction + proprio -> action chunk, and its imitation loss;
- ``adapters``: peft LoRA injection, checks and merging;
- ``model``: ``VLAModelConfig`` (the fields every VLA algorithm reads) and ``VLAModel`` (the policy for an env, its
  optimiser, inputs and chunk acting), composed by ``algos/vla_bc.py`` and ``algos/vla_rl.py``;
- ``habc``: sample weighting for behaviour cloning (``SampleWeighting``) and HABC's, which owns its critics;
- ``data``: LeRobot demonstrations as frames with chunks, outcomes and critic states, drawn as batches;
- ``rollouts``: chunk rollouts in a simulator (``ChunkLearner``, ``ChunkCollector``, ``SuccessBuffer``);
- ``export``: the exported graph (``ChunkPolicy``).

transformers and peft are imported only where a model is built, so ``import ctrl_rl`` stays light.
"""
