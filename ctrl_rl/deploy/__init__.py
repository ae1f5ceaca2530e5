"""Taking a policy out of Python and onto a robot (an application package, above ``learn``).

- ``export``: checkpoint -> ONNX and ``.pt2`` graphs with the normalizer, encoders and action rescaling inside,
  checked against eager, and ``policy.json``;
- ``runtime``: the deployment control loop (``RobotInterface``, the safety filter from ``ctrl_rl.robots``, a
  watchdog) and ``SimRobot``, any ctrl_rl env as the robot;
- ``server``, ``client``, ``wire`` and ``policy.proto``: the policy served over gRPC (``ctrl-rl serve``) and the
  robot side that asks it for actions (``ctrl-rl deploy --server``), docs/guides/serving.md.
"""
