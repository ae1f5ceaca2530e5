"""Vision-language-action models and their fine-tuning pieces (layer 2.75: below the algorithms).

- ``backbones``: transformers vision-language models behind one adapter (tiny configs or a local directory);
- ``tokenizer``: an offline byte-level BPE tokenizer for the tiny backbones, or the directory's own;
- ``heads``: action normalisation and the three action heads (tokens, regression, flow);
- ``policy``: ``VLAPolicy``, the sequence images + instruction + proprio -> action chunk;
- ``adapters``: peft LoRA injection, checks and merging;
- ``data``: LeRobot demonstrations as frames with chunks, outcomes and critic states;
- ``export``: the exported graph (``ChunkPolicy``).

transformers and peft are imported only where a model is built, so ``import ctrl_rl`` stays light.
"""
