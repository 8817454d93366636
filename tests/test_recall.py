"""The recall auxiliary task (rfwp_rl/recall.py): which steps it asks for, its value on a
hand-checked case, where its gradient goes, and the agent and trainer options that turn it on."""

import math

import pytest
import torch

from rfwp_rl.agent import Agent, AgentConfig
from rfwp_rl.errors import UserError
from rfwp_rl.impala.loss import compute_loss, loss_config
from rfwp_rl.recall import RecallHead, draw_lags, recall_loss


class Echo(RecallHead):
    """A head whose prediction is the core output itself (zeros below), so that the error is
    ||f_{t-k}||^2 and the target indexing can be checked by hand."""

    def forward(self, core_out, lag):
        return core_out


def test_targets_stay_in_the_unroll_and_the_episode():
    T, B, F = 6, 2, 1
    features = torch.arange(T * B, dtype=torch.float32).view(T, B, F)
    core_out = torch.zeros(T, B, F)
    done = torch.zeros(T, B, dtype=torch.bool)
    done[3, 1] = True  # env 1: a new episode starts at entry 3
    lag = torch.tensor([[1, 1], [1, 2], [2, 2], [3, 1], [2, 3], [5, 2]])
    total, mask = recall_loss(Echo(F, F, 5), core_out, features, done, lag)
    # env 0: t - k >= 0 at t >= k: t=0 (k1) no, 1 (k1) yes, 2 (k2) yes, 3 (k3) yes, 4 (k2) yes, 5 (k5) yes
    # env 1: t=0 (k1) no, 1 (k2) no, 2 (k2) yes, 3 (k1 -> 2: other episode) no, 4 (k3 -> 1) no, 5 (k2 -> 3) yes
    expected = torch.tensor([[0, 0], [1, 0], [1, 1], [1, 0], [1, 0], [1, 1]], dtype=torch.float32)
    torch.testing.assert_close(mask, expected)
    # error ||0 - f_{t-k}||^2 / Var(f) summed over the valid (t, b); f[t, b] = 2t + b
    f = lambda t, b: 2.0 * t + b  # noqa: E731
    valid = [(1, 0, 1), (2, 0, 2), (3, 0, 3), (4, 0, 2), (5, 0, 5), (2, 1, 2), (5, 1, 2)]
    scale = features.var(unbiased=False)
    want = sum(f(t - k, b) ** 2 for t, b, k in valid) / scale
    torch.testing.assert_close(total, want)


def test_lags_are_drawn_uniformly_over_the_episode_in_the_unroll():
    T, B, n = 8, 3, 4000
    done = torch.zeros(T, B, dtype=torch.bool)
    done[3, 0] = True  # env 0: an episode starts at entry 3
    done[0, 1] = done[5, 1] = True  # env 1: episodes start at entries 0 and 5; env 2: none inside the unroll
    g = torch.Generator().manual_seed(0)
    lags = torch.stack([draw_lags(done, 3, generator=g) for _ in range(n)])  # [n, T, B]
    # the furthest step back each entry may reach: t - (its episode's first entry in the unroll, else 0), at most 3
    high = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 3], [0, 1, 2, 3, 3, 0, 1, 2], [0, 1, 2, 3, 3, 3, 3, 3]]).T
    for t in range(T):
        for b in range(B):
            drawn = lags[:, t, b]
            if high[t, b] == 0:  # nothing earlier in the episode and the unroll: masked by recall_loss
                assert (drawn == 1).all()
                continue
            counts = torch.bincount(drawn, minlength=4)[1:]
            assert counts[high[t, b] :].sum() == 0, (t, b)  # never past the episode's first entry or the limit
            share = counts[: high[t, b]].float() / n
            torch.testing.assert_close(share, torch.full_like(share, 1 / float(high[t, b])), atol=0.03, rtol=0)
    _, valid = recall_loss(Echo(1, 1, 3), torch.zeros(T, B, 1), torch.randn(T, B, 1), done, lags[0])
    torch.testing.assert_close(valid, (high > 0).float())  # every other entry asks for a step it may see


def test_gradient_reaches_the_core_output_and_the_head_never_the_features():
    torch.manual_seed(0)
    T, B, H, F, L = 7, 3, 5, 4, 3
    head = RecallHead(H, F, L, hidden_size=8)
    core_out = torch.randn(T, B, H, requires_grad=True)
    features = torch.randn(T, B, F, requires_grad=True)
    lag = draw_lags(torch.zeros(T, B, dtype=torch.bool), L)
    assert lag.min() >= 1 and lag.max() <= L
    assert draw_lags(torch.zeros(4, 500, dtype=torch.bool), 10).max() == 3  # lags past the unroll are never drawn
    total, mask = recall_loss(head, core_out, features, torch.zeros(T, B, dtype=torch.bool), lag)
    total.backward()
    assert mask.sum() > 0 and core_out.grad.abs().sum() > 0
    assert features.grad is None
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in head.parameters())


def test_the_learner_trains_the_head_through_the_core():
    torch.manual_seed(0)
    agent = Agent((5,), 3, core="lstm", core_config={"hidden_size": 8}, agent_config={"recall_lags": 4})
    T, B = 6, 2
    batch = {
        "obs": torch.randn(T + 1, B, 5),
        "reward": torch.zeros(T + 1, B),
        "done": torch.zeros(T + 1, B, dtype=torch.bool),
        "action": torch.randint(0, 3, (T + 1, B)),
        "prev_action": torch.randint(0, 3, (T + 1, B)),
        "behaviour_log_prob": torch.full((T + 1, B), -1.0986),
    }
    state = agent.initial_state(B)
    with_recall, stats = compute_loss(agent, batch, state, loss_config(recall_cost=1.0))
    assert stats["loss/recall"] > 0
    with_recall.backward()
    assert agent.recall.net[0].weight.grad.abs().sum() > 0
    agent.zero_grad()
    without, stats0 = compute_loss(agent, batch, state, loss_config(recall_cost=0.0))
    without.backward()
    assert agent.recall.net[0].weight.grad is None and "loss/recall" not in stats0  # cost 0: not computed
    plain = Agent((5,), 3, core="lstm", core_config={"hidden_size": 8})
    assert plain.recall is None and "loss/recall" not in compute_loss(plain, batch, state, loss_config())[1]


def test_parameter_counts_are_the_acting_networks():
    from rfwp_rl.agent import count_parameters

    plain = Agent((5,), 3, core="lstm", core_config={"hidden_size": 8})
    with_head = Agent((5,), 3, core="lstm", core_config={"hidden_size": 8}, agent_config={"recall_lags": 4})
    assert count_parameters(with_head) == count_parameters(plain)
    assert sum(p.numel() for p in with_head.parameters()) == count_parameters(plain) + sum(
        p.numel() for p in with_head.recall.parameters()
    )


def test_acting_never_uses_the_head():
    agent = Agent((5,), 3, core="lstm", core_config={"hidden_size": 8}, agent_config={"recall_lags": 4})
    zeros = torch.zeros(1, 2)
    out, _ = agent(torch.randn(1, 2, 5), zeros, zeros, agent.initial_state(2), prev_action=zeros)
    assert "core_output" not in out and "features" not in out


@pytest.mark.parametrize("bad", [-1, 1.5, True, "8"])
def test_bad_recall_lags_are_one_line_errors(bad):
    with pytest.raises(UserError, match=r"agent recall_lags .* is invalid; allowed: 0 \(no recall head\)"):
        AgentConfig.from_dict({"recall_lags": bad})


def test_a_checkpoint_from_before_the_option_resumes_as_its_default(tmp_path):
    from rfwp_rl.checkpoint import Checkpointer
    from rfwp_rl.impala.run_spec import RunSpec

    now = AgentConfig().to_dict()
    before = {k: v for k, v in now.items() if k != "recall_lags"}  # written before the option existed
    Checkpointer(tmp_path, {"trainer": "impala", "agent": before}).save({"w": torch.zeros(1)}, 10)
    plain = Checkpointer(tmp_path, {"trainer": "impala", "agent": now}, upgrade=RunSpec.upgrade_meta)
    assert plain.load_latest()["step"] == 10
    with_head = Checkpointer(
        tmp_path, {"trainer": "impala", "agent": {**now, "recall_lags": 128}}, upgrade=RunSpec.upgrade_meta
    )
    with pytest.raises(UserError, match="agent.recall_lags: checkpoint has 0, this run has 128"):
        with_head.load_latest()


def test_symbols_are_weighted_by_how_rare_they_are():
    """Two steps of two single-channel cells; targets 0, 0 / 0, 5: value 0 is a target 3 times, value 5 once,
    so the weights are 1/3, 1/3, 1/3, 1 scaled to mean 1 (2/3, 2/3, 2/3, 2). The softmax runs over the values
    seen, 0 and 5: logits 0 and 3 give cross-entropies log(1 + e^3) and log(1 + e^-3)."""
    from rfwp_rl.recall import symbol_recall_sum

    head = RecallHead(2, 1, 3, hidden_size=4, grids=[(2, 1)])
    target = torch.tensor([[0, 0], [0, 5]])
    head.see(target)
    values, valid, place = head.vocabulary()
    assert values.tolist() == [[0, 5]] and valid.tolist() == [[True, True]] and place[0, 5] == 1
    head.symbol_logits = lambda core_out, lag, values, valid: torch.tensor([0.0, 3.0]).expand(2, 2, 2)
    ce0, ce5 = math.log(1 + math.exp(3.0)), math.log(1 + math.exp(-3.0))
    w0, w5 = 2 / 3, 2.0
    want = (w0 * ce0 + w0 * ce0) / 2 + (w0 * ce0 + w5 * ce5) / 2
    got = symbol_recall_sum(head, torch.zeros(2, 2), torch.ones(2, dtype=torch.long), target)
    torch.testing.assert_close(got, torch.tensor(want))


def test_the_symbols_softmax_over_the_values_seen_equals_the_full_one_restricted_to_them():
    """Three channels with 2, 3 and 1 values seen: the logits of symbol_logits are the full decoder's logits at
    those values, and -inf on the padding of the channels with fewer."""
    torch.manual_seed(0)
    head = RecallHead(4, 1, 3, hidden_size=8, grids=[(2, 3)])  # 2 cells x 3 channels: P = 6
    head.see(torch.tensor([[7, 1, 200, 3, 1, 200], [7, 9, 200, 3, 250, 200]]))
    values, valid, _ = head.vocabulary()
    assert [row[: int(n)] for row, n in zip(values.tolist(), valid.sum(1))] == [[3, 7], [1, 9, 250], [200]]
    assert valid.tolist() == [[True, True, False], [True, True, True], [True, False, False]]
    core_out, lag = torch.randn(5, 4), torch.tensor([1, 2, 3, 1, 2])
    got = head.symbol_logits(core_out, lag, values, valid)  # [5, 6, 3]
    cells = head.symbols(head._input(core_out, lag)).view(5, -1, 16)[:, head.cell_of]
    full = (
        torch.einsum("mpw,pwv->mpv", cells, head.decoder_weight[head.channel_of]) + head.decoder_bias[head.channel_of]
    )
    for p, channel in enumerate(head.channel_of.tolist()):
        n = int(valid[channel].sum())
        torch.testing.assert_close(got[:, p, :n], full[:, p, values[channel, :n]])
        assert torch.isinf(got[:, p, n:]).all()


def _grid_agent(**options):
    import numpy as np
    from gymnasium import spaces

    space = spaces.Dict({"image": spaces.Box(0, 255, (5, 5, 3), np.uint8), "direction": spaces.Discrete(4)})
    return Agent(space, 3, core="lstm", core_config={"hidden_size": 8}, agent_config=options)


def test_an_embedded_grid_agent_recalls_its_symbols_through_the_core():
    torch.manual_seed(0)
    agent = _grid_agent(recall_lags=4)
    assert agent.config.recall_symbols and agent.recall.symbols is not None
    T, B = 6, 2
    image = torch.randint(0, 11, (T + 1, B, 5, 5, 3), dtype=torch.uint8)
    batch = {
        "obs/image": image,
        "obs/direction": torch.randint(0, 4, (T + 1, B)),
        "reward": torch.zeros(T + 1, B),
        "done": torch.zeros(T + 1, B, dtype=torch.bool),
        "action": torch.randint(0, 3, (T + 1, B)),
        "prev_action": torch.randint(0, 3, (T + 1, B)),
        "behaviour_log_prob": torch.full((T + 1, B), -1.0986),
    }
    zeros = torch.zeros(T + 1, B)
    obs = {"image": image, "direction": batch["obs/direction"]}
    out, _ = agent(obs, zeros, zeros.bool(), agent.initial_state(B), prev_action=zeros.long(), with_features=True)
    assert torch.equal(out["symbols"], image.reshape(T + 1, B, -1).long())  # cell-major, channel last
    loss, stats = compute_loss(agent, batch, agent.initial_state(B), loss_config(recall_cost=1.0))
    loss.backward()
    assert agent.recall.symbols[0].weight.grad.abs().sum() > 0 and agent.recall.decoder_weight.grad.abs().sum() > 0
    assert all(p.grad is not None for p in agent.core.parameters())
    # the feature recall alone leaves the symbol head untouched
    off = _grid_agent(recall_lags=4, recall_symbols=False)
    assert not off.config.recall_symbols and off.recall.symbols is None


def test_recall_symbols_is_recorded_off_where_it_has_no_effect():
    assert not _grid_agent().config.recall_symbols  # no recall head
    assert not _grid_agent(recall_lags=4, grid_embedding=0).config.recall_symbols  # scaled cells
    assert not Agent((5,), 3, core="lstm", agent_config={"recall_lags": 4}).config.recall_symbols  # a vector


def test_a_meta_from_before_recall_symbols_reads_it_as_off():
    from rfwp_rl.impala.run_spec import RunSpec

    before = {k: v for k, v in AgentConfig().to_dict().items() if k != "recall_symbols"}
    assert RunSpec.upgrade_meta({"agent": before})["agent"]["recall_symbols"] is False
    assert RunSpec.upgrade_meta({"agent": AgentConfig().to_dict()})["agent"]["recall_symbols"] is True
