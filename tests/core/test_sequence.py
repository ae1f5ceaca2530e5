"""The LRU sequence model (core/sequence.py): the parallel scan, the LRU and the encoder over a sequence equal their
step-by-step recurrences, and the real-arithmetic step (ONNX) equals the complex one."""

import torch

from ctrl_rl.core import sequence
from ctrl_rl.core.sequence import LRU, LRUEncoder, linear_scan


def test_linear_scan_and_the_lru_over_a_sequence_equal_the_step_by_step_recurrence():
    torch.manual_seed(1)
    a, b = torch.randn(37, 2, 5, dtype=torch.complex64) * 0.5, torch.randn(37, 2, 5, dtype=torch.complex64)
    h, ref = torch.zeros(2, 5, dtype=torch.complex64), []
    for t in range(37):
        h = a[t] * h + b[t]
        ref.append(h)
    assert torch.allclose(linear_scan(a, b), torch.stack(ref), atol=1e-5)
    # both strategies of _scan (blocked: the CPU's for long sequences; Hillis-Steele: short ones and accelerators)
    assert torch.allclose(sequence._blocked(a, b), torch.stack(ref), atol=1e-5)
    assert torch.allclose(sequence._hillis_steele(a, b), torch.stack(ref), atol=1e-5)

    lru = LRU(8, 6, 0.0, 0.9, 6.28)
    S, N = 29, 3
    x, start = torch.randn(S, N, 8), torch.rand(S, N) < 0.15
    start[0] = True
    y, hs = lru(x, start)
    h = torch.zeros(N, 6, dtype=torch.complex64)
    for t in range(S):
        h = torch.where(start[t].unsqueeze(1), torch.zeros_like(h), h)
        yt, h = lru.step(x[t], h)
        assert torch.allclose(y[t], yt, atol=1e-5) and torch.allclose(hs[t], h, atol=1e-5)
    assert lru.lam().abs().max() < 0.9 + 1e-6

    enc = LRUEncoder(5, 16, 8, 2, 0.0, 0.9, 6.28)
    xs = torch.randn(S, N, 5)
    z, hid = enc(xs, start, at=torch.tensor([4, S - 1]))
    hid_t = torch.zeros(N, 2, 8, dtype=torch.complex64)
    for t in range(S):
        hid_t = torch.where(start[t][:, None, None], torch.zeros_like(hid_t), hid_t)
        zt, hid_t = enc.step(xs[t], hid_t)
        assert torch.allclose(z[t], zt, atol=1e-4)
        if t == 4:
            assert torch.allclose(hid[0], hid_t, atol=1e-5)
    assert torch.allclose(hid[1], hid_t, atol=1e-5)


def test_the_real_arithmetic_step_equals_the_complex_one():
    torch.manual_seed(2)
    enc = LRUEncoder(5, 16, 8, 2, 0.1, 0.9, 6.28)
    x = torch.randn(4, 5)
    h = torch.randn(4, 2, 8, dtype=torch.complex64)
    z, h1 = enc.step(x, h)
    z_r, h1_r = enc.step_real(x, torch.stack([h.real, h.imag], -1))
    assert torch.allclose(z, z_r, atol=1e-5)
    assert torch.allclose(torch.complex(h1_r[..., 0], h1_r[..., 1]), h1, atol=1e-5)
    assert enc.hidden_shape == (2, 8)


def test_linear_scan_of_one_and_of_a_power_of_two_rows():
    a, b = torch.full((1, 3), 0.5), torch.ones(1, 3)
    assert torch.equal(linear_scan(a, b), b)  # h_0 = b_0
    a, b = torch.full((8,), 0.5), torch.ones(8)
    want = torch.tensor([2 - 0.5**k for k in range(8)])  # h_t = sum_{j<=t} 0.5^j
    assert torch.allclose(linear_scan(a, b), want)


def test_the_scan_gradient_equals_autograd_through_the_step_by_step_recurrence():
    torch.manual_seed(3)
    for dtype in (torch.float64, torch.complex128):
        a = (torch.randn(23, 2, 4, dtype=dtype) * 0.5).requires_grad_(True)
        b = torch.randn(23, 2, 4, dtype=dtype, requires_grad=True)
        a0 = a.detach().clone()
        a0[5, 1] = 0  # a restart: the recurrence's coefficient is 0 there
        a0.requires_grad_(True)
        w = torch.randn(23, 2, 4, dtype=dtype)
        h, ref = torch.zeros(2, 4, dtype=dtype), []
        for t in range(23):
            h = a0[t] * h + b[t]
            ref.append(h)
        loss_ref = (torch.stack(ref) * w).real.sum()
        ga_ref, gb_ref = torch.autograd.grad(loss_ref, (a0, b))
        loss = (linear_scan(a0, b) * w).real.sum()
        ga, gb = torch.autograd.grad(loss, (a0, b))
        assert torch.allclose(ga, ga_ref, atol=1e-10) and torch.allclose(gb, gb_ref, atol=1e-10)
        assert torch.autograd.gradcheck(linear_scan, (a, b))


def test_the_blocked_scan_of_a_long_sequence_equals_the_recurrence():
    torch.manual_seed(4)
    T = 1000  # blocked (T >= 256), with padding (C = 32 does not divide 1000)
    a = torch.rand(T, 2, 3) * torch.exp(1j * torch.rand(T, 2, 3) * 6)
    a = a.to(torch.complex64)
    a[::97] = 0  # restarts
    b = torch.randn(T, 2, 3, dtype=torch.complex64)
    h, ref = torch.zeros(2, 3, dtype=torch.complex64), []
    for t in range(T):
        h = a[t] * h + b[t]
        ref.append(h)
    assert torch.allclose(linear_scan(a, b), torch.stack(ref), atol=1e-5)
