"""``core.optim.adam_step`` is ``Adam.step()`` bit for bit: the same fused kernel on the same state."""

import copy

import pytest
import torch

from ctrl_rl.core.optim import adam_step, set_grads


def _pair(**kw) -> tuple[list[torch.Tensor], torch.optim.Adam, list[torch.Tensor], torch.optim.Adam]:
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(5, 3, generator=g).requires_grad_(), torch.randn(3, generator=g).requires_grad_(),
         torch.randn((), generator=g).requires_grad_()]
    b = [x.detach().clone().requires_grad_() for x in a]
    groups = lambda ps: [{"params": ps[:2]}, {"params": ps[2:], "lr": 0.05}]  # noqa: E731
    return a, torch.optim.Adam(groups(a), lr=0.01, **kw), b, torch.optim.Adam(groups(b), lr=0.01, **kw)


def _grads(ps: list[torch.Tensor], k: int, skip_last: bool = False) -> None:
    g = torch.Generator().manual_seed(100 + k)
    for i, p in enumerate(ps):
        p.grad = None if skip_last and i == len(ps) - 1 else torch.randn(p.shape, generator=g)


@pytest.mark.parametrize("kw", [{"fused": True}, {"fused": True, "betas": (0.5, 0.99), "weight_decay": 0.1,
                                                  "maximize": True, "eps": 1e-6},
                                {"fused": True, "amsgrad": True}, {}])
def test_adam_step_is_the_optimizers_step_bit_for_bit(kw: dict) -> None:
    a, opt_a, b, opt_b = _pair(**kw)
    for k in range(6):
        _grads(a, k, skip_last=k == 2)  # a group without gradients in one step
        _grads(b, k, skip_last=k == 2)
        opt_a.step()
        adam_step(opt_b)
        for x, y in zip(a, b):
            assert torch.equal(x, y), (kw, k)
    sa, sb = opt_a.state_dict(), opt_b.state_dict()
    for i in sa["state"]:
        for key in sa["state"][i]:
            assert torch.equal(sa["state"][i][key], sb["state"][i][key]), (kw, i, key)


def test_adam_step_after_load_state_dict() -> None:
    a, opt_a, b, opt_b = _pair(fused=True)
    for k in range(2):
        _grads(a, k)
        opt_a.step()
    saved = copy.deepcopy(opt_a.state_dict())
    with torch.no_grad():
        for x, y in zip(a, b):
            y.copy_(x)
    opt_b.load_state_dict(saved)
    for k in range(2, 5):
        _grads(a, k)
        _grads(b, k)
        opt_a.step()
        adam_step(opt_b)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_adam_step_falls_back_to_step_for_other_optimizers() -> None:
    calls = []

    class Counting(torch.optim.SGD):
        def step(self, closure=None):  # type: ignore[override]
            calls.append(1)
            return super().step(closure)

    x = torch.ones(3, requires_grad=True)
    x.grad = torch.ones(3)
    adam_step(Counting([x], lr=0.5))
    assert calls == [1] and torch.equal(x.detach(), torch.full((3,), 0.5))


def test_adam_step_under_torch_compile_is_the_optimizers_step() -> None:
    """SAC's --compile traces its steps: adam_step then leaves the step to Adam.step (the raw kernel cannot be
    traced), with the same result."""
    a, opt_a, b, opt_b = _pair(fused=True)

    def step(opt: torch.optim.Adam) -> None:
        adam_step(opt)

    compiled = torch.compile(step)
    for k in range(3):
        _grads(a, k)
        _grads(b, k)
        opt_a.step()
        compiled(opt_b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("step", ["opt.step", "adam_step"])
def test_set_grads_lays_a_strided_gradient_out_like_its_parameter(step: str) -> None:
    """A fused Adam reads .grad in memory order: a transposed gradient assigned as is would update the wrong
    elements; set_grads hands it over in the parameter's layout, so the step equals the one on a contiguous copy."""
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(4, 3))
    ref = torch.nn.Parameter(w.detach().clone())
    g = torch.randn(3, 4).t()  # [4,3] with transposed strides, as a weight gradient of a transposed product
    assert not g.is_contiguous()
    opts = [torch.optim.Adam([p], lr=0.1, fused=True) for p in (w, ref)]
    set_grads([w], (g,))
    ref.grad = g.contiguous()
    assert w.grad is not None and w.grad.stride() == w.stride()
    for opt in opts:
        opt.step() if step == "opt.step" else adam_step(opt)
    torch.testing.assert_close(w, ref, rtol=0, atol=0)
    set_grads([w], (None,))  # an unused parameter keeps no gradient
    assert w.grad is None
