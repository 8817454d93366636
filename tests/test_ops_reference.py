"""The PyTorch reference recurrences in rfwp_rl.ops.reference (what the kernels are checked against)."""

from __future__ import annotations

import pytest
import torch

from rfwp_rl import ops
from rfwp_rl.ops import reference as ref

D = torch.float64


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _inputs(name: str, T: int = 5, B: int = 3, H: int = 2, d: int = 4, seed: int = 0,
            reset_at: tuple[tuple[int, int], ...] = ()) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Random float64 inputs of op ``name`` with a non-zero initial state (in signature order
    minus ``reset``) and the reset mask."""
    g = _gen(seed)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=D) * scale)

    def fm(*shape):  # positive, sum-one: what the feature maps hand the ops
        return torch.softmax(r(*shape), -1)

    def sig(*shape):
        return torch.sigmoid(r(*shape))

    reset = torch.zeros(T, B, dtype=torch.bool)
    for t, b in reset_at:
        reset[t, b] = True
    W0 = r(B, H, d, d, scale=0.5)
    if name == "lt":
        args = [fm(T, B, H, d), fm(T, B, H, d), r(T, B, H, d), W0]
    elif name == "delta":
        args = [fm(T, B, H, d), fm(T, B, H, d), r(T, B, H, d), sig(T, B, H), W0]
    elif name == "delta_rnn":
        args = [fm(T, B, H, d), fm(T, B, H, d), r(T, B, H, d), sig(T, B, H),
                fm(T, B, H, d), r(T, B, H, d), sig(T, B, H), W0, r(B, H, d, d, scale=0.5),
                r(B, H, d)]
    elif name == "rdn":
        args = [r(T, B, H, d), r(T, B, H, d), r(T, B, H, d), r(T, B, H),
                r(H, d, d, scale=d ** -0.5), r(H, d, d, scale=d ** -0.5),
                r(H, d, d, scale=d ** -0.5), r(H, d, scale=d ** -0.5), W0, r(B, H, d)]
    else:
        raise AssertionError(name)
    return args, reset


# indices (in signature order) of the state inputs and the time-major inputs of each op
STATE_ARGS = {"lt": (3,), "delta": (4,), "delta_rnn": (7, 8, 9), "rdn": (8, 9)}
TIME_ARGS = {"lt": (0, 1, 2), "delta": (0, 1, 2, 3), "delta_rnn": (0, 1, 2, 3, 4, 5, 6),
             "rdn": (0, 1, 2, 3)}
OPS = ("lt", "delta", "delta_rnn", "rdn")


def _final_state(name: str, out: tuple) -> tuple[torch.Tensor, ...]:
    """The op's final state in the order of its state inputs."""
    if name in ("lt", "delta"):
        return (out[1],)
    if name == "delta_rnn":
        return (out[1], out[2], out[0][-1])
    return (out[1], out[0][-1])


def test_get_reference_returns_these_functions():
    for name in OPS:
        assert ops.get(name, "reference") is getattr(ref, name)


# --------------------------------------------------------------------- hand-checkable cases

def test_delta_rule_one_hot_keys_write_overwrite_read():
    # B=H=1, d=3, β=1: write (e0, v) then read e0 -> v; overwrite (e0, v2) -> v2;
    # a second key e1 is untouched by the overwrite.
    e = torch.eye(3, dtype=D)
    v, v2, u = (torch.tensor(x, dtype=D) for x in ([1., 2., 3.], [-4., 0.5, 7.], [9., 8., 7.]))
    k = torch.stack([e[0], e[1], e[0]]).view(3, 1, 1, 3)
    vals = torch.stack([v, u, v2]).view(3, 1, 1, 3)
    q = torch.stack([e[0], e[0], e[0]]).view(3, 1, 1, 3)
    beta = torch.ones(3, 1, 1, dtype=D)
    W0 = torch.zeros(1, 1, 3, 3, dtype=D)
    y, W = ref.delta(q, k, vals, beta, W0, None)
    torch.testing.assert_close(y[0, 0, 0], v)
    torch.testing.assert_close(y[1, 0, 0], v)        # writing e1 did not disturb e0
    torch.testing.assert_close(y[2, 0, 0], v2)       # overwritten, not added
    torch.testing.assert_close(W[0, 0] @ e[1], u)
    # the same writes through the Linear Transformer add up: v + v2
    y_lt, _ = ref.lt(q, k, vals, W0, None)
    torch.testing.assert_close(y_lt[2, 0, 0], v + v2)


def test_delta_half_beta_interpolates():
    # β = 0.5 on an existing association: new value = 0.5 v_new + 0.5 v_old (FWM paper §3.1.1)
    e = torch.eye(2, dtype=D)
    k = torch.stack([e[1], e[1]]).view(2, 1, 1, 2)
    vals = torch.tensor([[2., 4.], [6., 0.]], dtype=D).view(2, 1, 1, 2)
    beta = torch.tensor([1.0, 0.5], dtype=D).view(2, 1, 1)
    y, _ = ref.delta(k, k, vals, beta, torch.zeros(1, 1, 2, 2, dtype=D), None)
    torch.testing.assert_close(y[1, 0, 0], torch.tensor([4., 2.], dtype=D))


def test_lt_equals_unnormalised_linear_attention_with_initial_state():
    # y_t = W0 q_t + Σ_{s≤t} v_s (k_s · q_t): the attention form of RFWP Eq. 6-7
    (q, k, v, W0), _ = _inputs("lt")
    y, W = ref.lt(q, k, v, W0, None)
    scores = torch.einsum("tbhd,sbhd->bhts", q, k).tril()
    expect = torch.einsum("bhts,sbhe->tbhe", scores, v) + torch.einsum("bhed,tbhd->tbhe", W0, q)
    torch.testing.assert_close(y, expect)
    torch.testing.assert_close(W, W0 + torch.einsum("tbhe,tbhd->bhed", v, k))


def test_delta_rnn_recurrent_query_is_uniform_after_reset():
    # with W = 0 and R0 set by one write (β_r = 1), y_0 = R softmax(0) = R·1/d
    T, B, H, d = 1, 1, 1, 3
    z = torch.zeros(T, B, H, d, dtype=D)
    zb = torch.zeros(T, B, H, dtype=D)
    kr = torch.tensor([0.2, 0.3, 0.5], dtype=D).view(1, 1, 1, 3)
    vr = torch.tensor([1., -2., 3.], dtype=D).view(1, 1, 1, 3)
    y, W, R = ref.delta_rnn(z, z, z, zb, kr, vr, torch.ones_like(zb),
                            torch.full((B, H, d, d), 5.0, dtype=D),
                            torch.full((B, H, d, d), 5.0, dtype=D),
                            torch.full((B, H, d), 3.0, dtype=D),
                            torch.ones(T, B, dtype=torch.bool))
    torch.testing.assert_close(R[0, 0], torch.outer(vr.flatten(), kr.flatten()))
    torch.testing.assert_close(y[0, 0, 0], vr.flatten() * kr.sum() / 3)
    torch.testing.assert_close(W, torch.zeros_like(W))


# --------------------------------------------------------------------- resets and side effects

@pytest.mark.parametrize("name", OPS)
def test_reset_equals_two_separate_sequences(name):
    T, cut = 6, 3
    args, _ = _inputs(name, T=T, B=2)
    reset = torch.zeros(T, 2, dtype=torch.bool)
    reset[cut, 1] = True                       # entry 1 restarts at step 3, entry 0 does not
    out = ref.__dict__[name](*args, reset)
    y = out[0]
    # entry 0: identical to running with no reset
    y_none = ref.__dict__[name](*args, None)[0]
    torch.testing.assert_close(y[:, 0], y_none[:, 0])
    # entry 1: first part as usual, second part from a zero state
    first = [a[:cut] if i in TIME_ARGS[name] else a for i, a in enumerate(args)]
    second = [a[cut:] if i in TIME_ARGS[name] else
              (torch.zeros_like(a) if i in STATE_ARGS[name] else a) for i, a in enumerate(args)]
    torch.testing.assert_close(y[:cut, 1], ref.__dict__[name](*first, None)[0][:, 1])
    out2 = ref.__dict__[name](*second, None)
    torch.testing.assert_close(y[cut:, 1], out2[0][:, 1])
    for s, s2 in zip(_final_state(name, out), _final_state(name, out2)):
        torch.testing.assert_close(s[1], s2[1])


@pytest.mark.parametrize("name", OPS)
def test_no_gradient_crosses_a_reset(name):
    T, cut = 5, 2
    args, _ = _inputs(name, T=T, B=2)
    args = [a.requires_grad_() for a in args]
    reset = torch.zeros(T, 2, dtype=torch.bool)
    reset[cut, :] = True
    y = ref.__dict__[name](*args, reset)[0]
    y[cut:].sum().backward()
    for i in TIME_ARGS[name]:
        assert args[i].grad[:cut].abs().max() == 0, f"input {i} before the reset got gradient"
        assert args[i].grad[cut:].abs().max() > 0
    for i in STATE_ARGS[name]:
        assert args[i].grad.abs().max() == 0, f"initial state {i} got gradient across a reset"


@pytest.mark.parametrize("name", OPS)
def test_inputs_not_modified(name):
    args, reset = _inputs(name, reset_at=((2, 0),))
    before = [a.clone() for a in args]
    versions = [a._version for a in args]
    ref.__dict__[name](*args, reset)
    for a, b, ver in zip(args, before, versions):
        assert torch.equal(a, b) and a._version == ver


@pytest.mark.parametrize("name", OPS)
def test_one_call_equals_chained_calls(name):
    T, cut = 6, 4
    args, reset = _inputs(name, T=T, reset_at=((1, 0), (4, 2), (5, 1)))
    out = ref.__dict__[name](*args, reset)
    first = [a[:cut] if i in TIME_ARGS[name] else a for i, a in enumerate(args)]
    out1 = ref.__dict__[name](*first, reset[:cut])
    state = dict(zip(STATE_ARGS[name], _final_state(name, out1)))
    second = [a[cut:] if i in TIME_ARGS[name] else state.get(i, a) for i, a in enumerate(args)]
    out2 = ref.__dict__[name](*second, reset[cut:])
    torch.testing.assert_close(out[0], torch.cat([out1[0], out2[0]]))
    for s, s2 in zip(_final_state(name, out), _final_state(name, out2)):
        torch.testing.assert_close(s, s2)


def test_rdn_feature_map_keyword():
    args, reset = _inputs("rdn", reset_at=((2, 1),))
    y_soft = ref.rdn(*args, reset)[0]
    torch.testing.assert_close(ref.rdn(*args, reset, feature_map=lambda x: torch.softmax(x, -1))[0],
                               y_soft)
    # a map that doubles the key size: W becomes [B, H, d, 2d]
    W0 = torch.zeros(*args[8].shape[:-1], 2 * args[8].shape[-1], dtype=D)
    dbl = lambda x: torch.softmax(torch.cat([x, -x], -1), -1)  # noqa: E731
    y, W = ref.rdn(*args[:8], W0, args[9], reset, feature_map=dbl)
    assert y.shape == y_soft.shape and W.shape == W0.shape
    assert not torch.allclose(y, y_soft)


# --------------------------------------------------------------------- gradients

@pytest.mark.parametrize("name", OPS)
def test_gradcheck_with_initial_state_and_reset(name):
    # non-zero initial state (the reference code's LT backward got this wrong) + a mid reset
    args, reset = _inputs(name, T=3, B=2, H=1, d=2, reset_at=((2, 1),))
    args = [a.requires_grad_() for a in args]
    fn = lambda *a: ref.__dict__[name](*a, reset)  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(args), eps=1e-6, atol=1e-6)
