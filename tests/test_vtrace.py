"""V-trace against an independent implementation of IMPALA Eq. 1 in its sum form."""

import math

import pytest
import torch

from rfwp_rl.impala import vtrace


def vtrace_eq1(log_rhos, discounts, rewards, values, bootstrap, rho_bar, c_bar, pg_rho_bar):
    """Direct double loop over IMPALA Eq. 1 (plain Python floats):
    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V,
    delta_t V = rho_t (r_t + gamma_t V(x_{t+1}) - V(x_t)); with per-step discounts gamma_i the
    factor gamma^{t-s} of the paper becomes prod_{i=s}^{t-1} gamma_i."""
    T, B = len(rewards), len(rewards[0])
    clip = lambda x, m: x if m is None else min(x, m)
    vs = [[0.0] * B for _ in range(T)]
    adv = [[0.0] * B for _ in range(T)]
    for b in range(B):
        V = [values[t][b] for t in range(T)] + [bootstrap[b]]
        ratio = [math.exp(log_rhos[t][b]) for t in range(T)]
        for s in range(T):
            total = V[s]
            for t in range(s, T):
                coef = 1.0
                for i in range(s, t):
                    coef *= discounts[i][b] * clip(ratio[i], c_bar)
                delta = clip(ratio[t], rho_bar) * (rewards[t][b] + discounts[t][b] * V[t + 1] - V[t])
                total += coef * delta
            vs[s][b] = total
        for s in range(T):
            v_next = vs[s + 1][b] if s + 1 < T else bootstrap[b]
            adv[s][b] = clip(ratio[s], pg_rho_bar) * (rewards[s][b] + discounts[s][b] * v_next - V[s])
    return torch.tensor(vs, dtype=torch.float64), torch.tensor(adv, dtype=torch.float64)


def random_batch(T=7, B=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    log_rhos = torch.randn(T, B, generator=g, dtype=torch.float64) * 0.8  # ratios both < 1 and > 1
    done = torch.rand(T, B, generator=g) < 0.2  # episode ends inside the unroll
    done[2, 0] = True
    discounts = (~done).double() * 0.99
    rewards = torch.randn(T, B, generator=g, dtype=torch.float64)
    values = torch.randn(T, B, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(B, generator=g, dtype=torch.float64)
    return log_rhos, discounts, rewards, values, bootstrap


@pytest.mark.parametrize(
    "rho_bar,c_bar,pg_rho_bar", [(1.0, 1.0, 1.0), (2.0, 0.5, 1.5), (None, None, None), (0.7, 1.3, 0.9)]
)
@pytest.mark.parametrize("seed", [0, 1])
def test_vtrace_matches_eq1(rho_bar, c_bar, pg_rho_bar, seed):
    log_rhos, discounts, rewards, values, bootstrap = random_batch(seed=seed)
    out = vtrace.from_importance_weights(
        log_rhos,
        discounts,
        rewards,
        values,
        bootstrap,
        clip_rho_threshold=rho_bar,
        clip_c_threshold=c_bar,
        clip_pg_rho_threshold=pg_rho_bar,
    )
    ref_vs, ref_adv = vtrace_eq1(
        log_rhos.tolist(),
        discounts.tolist(),
        rewards.tolist(),
        values.tolist(),
        bootstrap.tolist(),
        rho_bar,
        c_bar,
        pg_rho_bar,
    )
    assert out.vs.shape == (7, 5) and out.pg_advantages.shape == (7, 5)
    torch.testing.assert_close(out.vs, ref_vs, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out.pg_advantages, ref_adv, rtol=1e-10, atol=1e-10)


def test_on_policy_no_discount_end_is_n_step_return():
    # On-policy (ratio 1) v_s is the discounted return bootstrapped with V(x_T), cut at episode ends.
    T, B = 4, 1
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    discounts = torch.tensor([[0.5], [0.0], [0.5], [0.5]])
    values = torch.tensor([[10.0], [20.0], [30.0], [40.0]])
    bootstrap = torch.tensor([8.0])
    out = vtrace.from_importance_weights(torch.zeros(T, B), discounts, rewards, values, bootstrap)
    expected = torch.tensor([[1 + 0.5 * 2], [2.0], [3 + 0.5 * (4 + 0.5 * 8)], [4 + 0.5 * 8]])
    torch.testing.assert_close(out.vs, expected)


def test_truncation_mid_unroll_bootstraps_from_the_last_observation():
    """Hand-computed case: entries x0..x3 and bootstrap x4, gamma 0.9, on-policy. x1 is the last
    observation of an episode cut by a time limit (mask 0), x2 starts the next episode (so the
    discount after x1 is 0)."""
    values = torch.tensor([[0.2], [3.0], [-1.0], [0.4]], dtype=torch.float64)
    bootstrap = torch.tensor([2.0], dtype=torch.float64)
    rewards = torch.tensor([[1.0], [0.0], [0.5], [0.0]], dtype=torch.float64)  # x0->x1, x1->x2 (no action ran), ...
    discounts = torch.tensor([[0.9], [0.0], [0.9], [0.9]], dtype=torch.float64)
    mask = torch.tensor([[1.0], [0.0], [1.0], [1.0]], dtype=torch.float64)
    out = vtrace.from_importance_weights(
        torch.zeros(4, 1, dtype=torch.float64), discounts, rewards, values, bootstrap, mask=mask
    )
    # v3 = 0 + .9*2 = 1.8; v2 = .5 + .9*1.8 = 2.12; v1 = V(x1) = 3; v0 = 1 + .9*V(x1) = 3.7
    assert out.vs[:, 0].tolist() == pytest.approx([3.7, 3.0, 2.12, 1.8])
    # A0 = 1 + .9*3 - .2 = 3.5; A1 = 0 (masked); A2 = .5 + .9*1.8 + 1 = 3.12; A3 = .9*2 - .4 = 1.4
    assert out.pg_advantages[:, 0].tolist() == pytest.approx([3.5, 0.0, 3.12, 1.4])
    # treating the time limit as termination (the bug this avoids) would give v0 = 1.0
    as_termination = vtrace.from_importance_weights(
        torch.zeros(4, 1, dtype=torch.float64),
        torch.tensor([[0.0], [0.0], [0.9], [0.9]], dtype=torch.float64),
        rewards,
        values,
        bootstrap,
    )
    assert float(as_termination.vs[0, 0]) == pytest.approx(1.0)


def test_truncation_off_policy_matches_eq1_on_the_valid_steps():
    """With clipped ratios the masked step still contributes nothing: the targets before it equal
    Eq. 1 on the episode cut at the truncation with V(last observation) as its bootstrap."""
    log_rhos, discounts, rewards, values, bootstrap = random_batch(T=6, B=1, seed=3)
    discounts[:] = 0.99
    discounts[3] = 0.0  # entry 4 starts a new episode; entry 3 is the truncated episode's last observation
    mask = torch.ones(6, 1, dtype=torch.float64)
    mask[3] = 0.0
    out = vtrace.from_importance_weights(log_rhos, discounts, rewards, values, bootstrap, 1.0, 1.0, 1.0, mask=mask)
    head_vs, head_adv = vtrace_eq1(
        log_rhos[:3].tolist(),
        discounts[:3].tolist(),
        rewards[:3].tolist(),
        values[:3].tolist(),
        values[3].tolist(),
        1.0,
        1.0,
        1.0,
    )
    assert torch.allclose(out.vs[:3], head_vs)
    assert torch.allclose(out.pg_advantages[:3], head_adv)
    assert float(out.vs[3, 0]) == pytest.approx(float(values[3, 0]))
    assert float(out.pg_advantages[3, 0]) == 0.0


def test_lambda_on_policy_is_td_lambda():
    """IMPALA Remark 2: with c_i = lambda * min(c_bar, rho_i), on-policy V-trace is TD(lambda):
    v_t = V(x_t) + sum_k (gamma lambda)^(k-t) delta_k, checked against the lambda-return recursion
    G_t = r_t + gamma ((1 - lambda) V(x_{t+1}) + lambda G_{t+1}), G_T = V(x_T)."""
    T, gamma, lam = 6, 0.9, 0.7
    g = torch.Generator().manual_seed(5)
    rewards = torch.randn(T, 1, generator=g, dtype=torch.float64)
    values = torch.randn(T, 1, generator=g, dtype=torch.float64)
    bootstrap = torch.randn(1, generator=g, dtype=torch.float64)
    discounts = torch.full((T, 1), gamma, dtype=torch.float64)
    out = vtrace.from_importance_weights(
        torch.zeros(T, 1, dtype=torch.float64), discounts, rewards, values, bootstrap, lambda_=lam
    )
    expected, g_next = [], float(bootstrap[0])
    v_next = float(bootstrap[0])
    for t in reversed(range(T)):
        g_next = float(rewards[t, 0]) + gamma * ((1 - lam) * v_next + lam * g_next)
        v_next = float(values[t, 0])
        expected.append(g_next)
    assert out.vs[:, 0].tolist() == pytest.approx(expected[::-1])
    # lambda = 0: one-step TD targets
    td0 = vtrace.from_importance_weights(
        torch.zeros(T, 1, dtype=torch.float64), discounts, rewards, values, bootstrap, lambda_=0.0
    )
    nxt = torch.cat([values[1:], bootstrap.view(1, 1)])
    assert torch.allclose(td0.vs, rewards + gamma * nxt)


def test_advantage_scale_is_the_rms_with_a_floor_relative_to_the_targets():
    from rfwp_rl.impala.loss import advantage_scale

    adv = torch.tensor([[3.0, 4.0], [0.0, 100.0]])
    targets = torch.tensor([[10.0, 10.0], [10.0, 50.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])  # the 100 / 50 step is masked out
    # RMS of (3, 4, 0) = sqrt(25 / 3) = 2.887; targets' RMS = 10
    assert float(advantage_scale(adv, targets, mask, 0.0)) == pytest.approx((25 / 3) ** 0.5)
    assert float(advantage_scale(adv, targets, mask, 0.1)) == pytest.approx((25 / 3) ** 0.5)
    assert float(advantage_scale(adv, targets, mask, 0.5)) == pytest.approx(5.0)
    # a solved task: advantages are noise of size 1e-3 on returns of size 1, kept at 1e-2, not 1
    noise = torch.full((4, 3), 1e-3)
    ones = torch.ones(4, 3)
    assert float((noise / advantage_scale(noise, ones, ones, 0.1)).abs().max()) == pytest.approx(1e-2)
    assert float(advantage_scale(torch.zeros(2, 2), torch.zeros(2, 2), torch.ones(2, 2), 0.1)) == pytest.approx(1e-8)


def test_advantage_scale_has_a_minimum_in_the_values_units():
    from rfwp_rl.impala.loss import advantage_scale

    # a sparse reward not yet found: targets near 0, advantages value noise of size 1e-2
    noise = torch.tensor([[1e-2, -1e-2], [1e-2, -1e-2]])
    zeros, ones = torch.zeros(2, 2), torch.ones(2, 2)
    assert float(advantage_scale(noise, zeros, ones, 0.3)) == pytest.approx(1e-2)  # noise made unit-sized
    assert float((noise / advantage_scale(noise, zeros, ones, 0.3, 0.1)).abs().max()) == pytest.approx(0.1)
    # advantages above the minimum are divided by their RMS as before
    adv = torch.tensor([[3.0, -4.0], [0.0, 0.0]])  # RMS 2.5
    assert float(advantage_scale(adv, zeros, ones, 0.3, 0.1)) == pytest.approx(2.5)


def test_host_floats_reads_tensors_that_need_gradients_without_a_warning():
    import warnings

    from rfwp_rl.impala.loss import host_floats

    loss = (torch.ones(3, requires_grad=True) * 2).sum()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert host_floats({"total": loss, "count": 4}) == {"total": 6.0, "count": 4.0}
