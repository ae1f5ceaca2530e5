"""The policy server: ``ctrl-rl serve EXPORT`` answers ``Act`` calls with the export's actions over gRPC.

Messages are ``policy.proto``'s, served through grpcio's generic handlers with ``wire.py``'s codec (no generated
stubs, no protoc). The server is stateless: a call carries every graph input (the observation parts at batch B,
and a recurrent export's ``prev_action``, ``prev_reward`` and ``hidden``) and gets every graph output back, so it
serves any export the deploy runtime runs (MLP, image, recurrent, VLA action chunks with the prompt's token ids)
and a restarted server continues where the old one stopped. The robot side (``client.py`` and the runtime's
``ControlLoop``) keeps the recurrent state and the chunk queue.

Security, in this order for every call:

1. **Bind**: loopback (``127.0.0.1``) unless ``--host`` says otherwise; a non-loopback address without a token is
   served with a warning. Port reuse is off, so a second server cannot share the port.
2. **Size**: gRPC refuses a request larger than the export's inputs at ``--max-batch`` rows (plus a margin) with
   RESOURCE_EXHAUSTED before any of it is decoded; answers are bounded the same way; at most ``4 * --workers``
   calls are in flight, more are refused with RESOURCE_EXHAUSTED.
3. **Token** (``--token`` or ``$CTRL_RL_TOKEN``): a call without the metadata ``authorization: Bearer <token>`` is
   refused with UNAUTHENTICATED (compared in constant time).
4. **Shape**: bytes that are not an ``ActRequest``, a missing, unknown or repeated input, a dtype other than the
   export's, a shape other than ``[B, *shape]`` or a batch outside ``1..max_batch`` is refused with
   INVALID_ARGUMENT and one sentence saying what was expected.
5. **Policy**: an exception inside inference is answered with INTERNAL; the server goes on serving.

The first refusal of each kind is written to stderr, later ones are counted (printed when the server stops).
The commands, the fault behaviour of the robot side and the latency: docs/guides/serving.md#security.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ctrl_rl.deploy import wire
from ctrl_rl.errors import UserInputError

SERVICE = "ctrl_rl.policy.v1.Policy"
"""The gRPC service of ``policy.proto``: methods ``/ctrl_rl.policy.v1.Policy/Info`` and ``.../Act``."""
TOKEN_ENV = "CTRL_RL_TOKEN"
"""Environment variable read for the shared token when ``--token`` is not given (keeps it out of ``ps``)."""
MESSAGE_MARGIN = 64 * 1024
"""Bytes allowed on top of the tensors' data in a message (names, shapes, framing)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    """Address to listen on: loopback by default; 0.0.0.0 or a LAN address serves other machines (set a token)."""
    port: int = 50051
    """TCP port (0: any free port; the address is printed)."""
    token: str | None = None
    """Shared token every call must carry as ``authorization: Bearer <token>`` (default: $CTRL_RL_TOKEN, else none)."""
    max_batch: int = 8
    """Largest batch of observations one call may carry; sets the largest request accepted."""
    workers: int = 2
    """Threads answering calls (each runs onnxruntime with one thread)."""

    def __post_init__(self) -> None:
        if not self.host:
            raise UserInputError("invalid --host '': expected an address to listen on such as 127.0.0.1")
        if not 0 <= self.port <= 65535:
            raise UserInputError(f"invalid --port {self.port!r}: expected a TCP port in 0..65535 (0: any free one)")
        if self.token is not None and not self.token:
            raise UserInputError("invalid --token '': expected a non-empty shared token, or no --token")
        if self.max_batch < 1:
            raise UserInputError(f"invalid --max-batch {self.max_batch!r}: expected an integer >= 1")
        if self.workers < 1:
            raise UserInputError(f"invalid --workers {self.workers!r}: expected an integer >= 1")


class Refusal(Exception):
    """A call answered with an error status (``code``: a grpc.StatusCode) and one sentence."""

    def __init__(self, code: Any, message: str):
        super().__init__(message)
        self.code = code


class PolicyServer:
    """An export behind the gRPC service (module docstring). ``policy``: a callable of the input dict (default:
    ``policy.onnx`` in onnxruntime); tests pass their own."""

    def __init__(self, export_dir: str | Path, opts: ServeOptions = ServeOptions(),
                 policy: Callable[[dict[str, np.ndarray]], list] | None = None):
        from ctrl_rl.deploy.runtime import OnnxPolicy
        from ctrl_rl.deploy.sidecar import read_export

        self.export_dir, self.opts = Path(export_dir), opts
        self.meta = read_export(export_dir)
        raw = (self.export_dir / "policy.json").read_bytes()
        self.sha256 = hashlib.sha256(raw).hexdigest()
        self.policy_json = raw.decode("utf-8")
        if policy is None:
            if "onnx" not in self.meta["files"]:
                raise UserInputError(f"{str(export_dir)!r} has no policy.onnx: expected an export made with "
                                     "--format onnx (the server runs onnxruntime)")
            policy = OnnxPolicy(self.export_dir / self.meta["files"]["onnx"])
        self.policy = policy
        self.inputs = {i["name"]: (tuple(int(d) for d in i["shape"][1:]), str(i["dtype"])) for i in self.meta["inputs"]}
        if self.meta.get("recurrent"):
            r = self.meta["recurrent"]
            self.inputs |= {"prev_action": (tuple(r["prev_action"][1:]), "float32"), "prev_reward": ((), "float32"),
                            "hidden": (tuple(r["hidden"][1:]), "float32")}
        self.outputs = list(self.meta["outputs"])
        self.token = opts.token if opts.token is not None else (os.environ.get(TOKEN_ENV) or None)
        # one warm-up call at batch 1: the export runs, and the size of an answer per row
        zeros = {n: np.zeros((1, *s), np.dtype(d)) for n, (s, d) in self.inputs.items()}
        out = [np.asarray(o) for o in self.policy(zeros)]
        row_in = sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in self.inputs.values())
        row_out = sum(o.nbytes for o in out)
        self.max_request = opts.max_batch * row_in + MESSAGE_MARGIN
        self.max_answer = max(opts.max_batch * row_out, len(raw)) + MESSAGE_MARGIN
        self.refused: Counter[str] = Counter()
        self.served = 0
        self._lock = threading.Lock()
        self._server: Any = None
        self.port: int | None = None

    # ------------------------------------------------------------------------------------------ the calls
    def _authorize(self, context) -> None:
        import grpc

        if self.token is None:
            return
        got = dict(context.invocation_metadata()).get("authorization", "")
        want = f"Bearer {self.token}"
        if not hmac.compare_digest(str(got).encode(), want.encode()):
            raise Refusal(grpc.StatusCode.UNAUTHENTICATED,
                          "the call carries no valid token: expected the metadata 'authorization: Bearer <token>' "
                          "with the server's token")

    def check(self, request: wire.ActRequest) -> dict[str, np.ndarray]:
        """The request's inputs as the policy's feed; ``Refusal`` (INVALID_ARGUMENT) with one sentence otherwise."""
        import grpc

        bad = grpc.StatusCode.INVALID_ARGUMENT
        expected = list(self.inputs)
        feed: dict[str, np.ndarray] = {}
        batch = None
        for t in request.inputs:
            if t.name not in self.inputs:
                raise Refusal(bad, f"the request has an input {t.name[:64]!r} the export does not take: "
                                   f"expected exactly the inputs {expected}")
            if t.name in feed:
                raise Refusal(bad, f"the request has the input {t.name!r} twice: expected each input once")
            shape, dtype = self.inputs[t.name]
            try:
                a = wire.to_array(t)
            except wire.WireError as e:
                raise Refusal(bad, str(e)) from None
            if a.dtype.name != dtype:
                raise Refusal(bad, f"input {t.name!r} has dtype {a.dtype.name}: expected {dtype}")
            if a.ndim != len(shape) + 1 or tuple(a.shape[1:]) != shape:
                want = ", ".join(["B", *map(str, shape)])
                raise Refusal(bad, f"input {t.name!r} has shape {list(a.shape)}: expected [{want}] with "
                                   f"1 <= B <= {self.opts.max_batch}")
            if batch is None:
                batch = a.shape[0]
                if not 1 <= batch <= self.opts.max_batch:
                    raise Refusal(bad, f"the request's batch is {batch}: expected 1 to {self.opts.max_batch} rows")
            elif a.shape[0] != batch:
                raise Refusal(bad, f"input {t.name!r} has batch {a.shape[0]} and another input {batch}: "
                                   "expected one batch size for all inputs")
            feed[t.name] = a
        missing = [n for n in expected if n not in feed]
        if missing:
            raise Refusal(bad, f"the request lacks the input {missing[0]!r}: expected exactly the inputs {expected}")
        return feed

    def _call(self, name: str, body: Callable[[bytes], bytes], request: bytes, context) -> bytes:
        import grpc

        try:
            self._authorize(context)
            answer = body(request)
            with self._lock:
                self.served += 1
            return answer
        except Refusal as e:
            refusal = e
        except Exception as e:  # never a crash: the policy's own failure is the caller's INTERNAL error
            refusal = Refusal(grpc.StatusCode.INTERNAL, f"the policy failed on this request ({type(e).__name__}: "
                                                        f"{str(e)[:300]}): expected inputs it can run")
        code, message = refusal.code, str(refusal)
        with self._lock:
            first = self.refused[code.name] == 0
            self.refused[code.name] += 1
        if first:
            print(f"ctrl-rl serve: refused {name} with {code.name}: {message} (later ones are counted)",
                  file=sys.stderr, flush=True)
        context.set_code(code)
        context.set_details(message)
        return b""

    def _info(self, request: bytes) -> bytes:
        return wire.encode(wire.InfoResponse(self.policy_json, self.sha256, self.opts.max_batch))

    def _act(self, request: bytes) -> bytes:
        import grpc

        t0 = time.perf_counter()
        try:
            req = wire.decode(wire.ActRequest, request)
        except wire.WireError as e:
            raise Refusal(grpc.StatusCode.INVALID_ARGUMENT, f"the request is not an ActRequest of policy.proto ({e})"
                          ) from None
        out = self.policy(self.check(req))
        tensors = [wire.to_tensor(n, np.asarray(o)) for n, o in zip(self.outputs, out)]
        return wire.encode(wire.ActResponse(tensors, req.request_id, (time.perf_counter() - t0) * 1e3))

    # ------------------------------------------------------------------------------------------ lifecycle
    def start(self) -> int:
        """Listen and serve in the background; returns the port (the one picked when ``port`` is 0)."""
        import grpc

        def handler(name, body):
            return grpc.unary_unary_rpc_method_handler(lambda req, ctx: self._call(name, body, req, ctx))

        generic = grpc.method_handlers_generic_handler(SERVICE, {"Info": handler("Info", self._info),
                                                                 "Act": handler("Act", self._act)})
        options = [("grpc.max_receive_message_length", self.max_request),
                   ("grpc.max_send_message_length", self.max_answer),
                   ("grpc.so_reuseport", 0)]
        server = grpc.server(futures.ThreadPoolExecutor(self.opts.workers, thread_name_prefix="ctrl-rl-serve"),
                             handlers=[generic], options=options, maximum_concurrent_rpcs=4 * self.opts.workers)
        where = address(self.opts.host, self.opts.port)
        try:
            port = server.add_insecure_port(where)
        except RuntimeError:
            port = 0
        if not port:
            raise UserInputError(f"cannot listen on {where}: expected a free port on an address of this machine "
                                 "(another server running? pick another --port, or 0 for any free one)")
        server.start()
        self._server, self.port = server, port
        if not is_loopback(self.opts.host) and self.token is None:
            print(f"ctrl-rl serve: warning: listening on {where} without a token: anyone who reaches this port gets "
                  f"the policy's actions; set --token or ${TOKEN_ENV}", file=sys.stderr, flush=True)
        return port

    def stop(self, grace: float = 0.5) -> None:
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None

    def summary(self) -> dict:
        return {"served": self.served, "refused": dict(self.refused)}


def serve(export_dir: str, opts: ServeOptions) -> int:
    """``ctrl-rl serve``: listen, print one JSON line (address, export, inputs), serve until SIGINT or SIGTERM."""
    try:
        import grpc  # noqa: F401
    except ImportError as e:
        raise UserInputError(f"ctrl-rl serve needs the package grpcio ({e}): expected it installed "
                             "(pip install 'ctrl-rl[serve]')") from None
    server = PolicyServer(export_dir, opts)
    port = server.start()
    done = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(json.dumps({"serving": str(export_dir), "address": address(opts.host, port), "export_sha256": server.sha256,
                      "inputs": {n: [list(s), d] for n, (s, d) in server.inputs.items()}, "outputs": server.outputs,
                      "token": server.token is not None, "max_batch": opts.max_batch,
                      "max_request_bytes": server.max_request}), flush=True)
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
        print(f"ctrl-rl serve: stopped ({json.dumps(server.summary())})", file=sys.stderr, flush=True)
    return 0
