"""World models for model-based RL: batched dynamics ensembles, termination functions, and the model as an
environment (ModelEnv).

Layer: above storage (it may use core, envs and storage), below algos (MOPO, RAVL and NeuBay use it).
"""
