"""Robots: specs (limits, rates, action spaces), policy export and the deployment runtime.

``robots.spec`` and ``robots.safety`` are plain data and math (the core layer: tasks and the runtime use them);
``robots.export`` and ``robots.runtime`` are applications (they read checkpoints and run onnxruntime).
"""
