import math

import pytest
import torch

from krill.rl.loss import LossConfig, policy_loss

CFG = LossConfig(clip_low=0.2, clip_high=0.28, is_cap=2.0)


def _one_token(ratio: float, adv: float, cfg: LossConfig = CFG):
    logp = torch.tensor([[math.log(ratio) + math.log(0.5)]], dtype=torch.float64, requires_grad=True)
    behaviour = torch.tensor([[math.log(0.5)]], dtype=torch.float64)
    loss, stats = policy_loss(logp, behaviour, torch.tensor([adv], dtype=torch.float64),
                              torch.ones(1, 1, dtype=torch.float64), cfg)
    loss.backward()
    return float(loss.detach()), float(logp.grad[0, 0]), stats


@pytest.mark.parametrize("ratio,adv,loss,grad,clip,trunc", [
    (1.0, 1.0, -1.0, -1.0, 0, 0),           # on-policy: gradient A * dlogp
    (1.1, 1.0, -1.1, -1.1, 0, 0),           # inside the trust region: weight r
    (1.5, 1.0, -1.28, 0.0, 1, 0),           # A > 0 above 1 + 0.28: clipped, no gradient
    (0.5, -1.0, 0.8, 0.0, 1, 0),            # A < 0 below 1 - 0.2: clipped, no gradient
    (0.5, 1.0, -0.5, -0.5, 0, 0),           # A > 0 below the floor: min picks r A, weight r
    (1.5, -1.0, 1.5, 1.5, 0, 0),            # A < 0 above the ceiling: unclipped, weight r < C
    (4.0, -1.0, 2.0, 2.0, 0, 1),            # A < 0, r = 4 > C = 2: weight truncated to C
    (4.0, 1.0, -0.64, 0.0, 1, 1),           # A > 0, r = 4: clipped (1.28 A) times C / r
])
def test_clipped_truncated_surrogate_by_hand(ratio, adv, loss, grad, clip, trunc):
    got_loss, got_grad, stats = _one_token(ratio, adv)
    assert got_loss == pytest.approx(loss, abs=1e-9)
    assert got_grad == pytest.approx(grad, abs=1e-9)
    assert stats["clip_fraction"] == clip and stats["truncated_fraction"] == trunc


def test_token_normalisation_and_mask():
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.5, 0.25, 0.9]])).requires_grad_(True)
    behaviour = logp.detach().clone()
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, stats = policy_loss(logp, behaviour, torch.tensor([1.0, -2.0]), mask, CFG)
    assert float(loss.detach()) == pytest.approx(-(1 + 1 - 2) / 3)
    assert stats["tokens"] == 3
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 3, -1 / 3, 0.0], [2 / 3, 0.0, 0.0]]))
    loss6, _ = policy_loss(logp, behaviour, torch.tensor([1.0, -2.0]), mask, CFG, num_tokens=6)
    assert float(loss6.detach()) == pytest.approx(float(loss.detach()) / 2)


def test_k3_kl_penalty():
    cfg = LossConfig(kl_coef=0.5)
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    loss, stats = policy_loss(logp, logp.clone(), torch.tensor([0.0]), torch.ones(1, 1), cfg, ref_logprobs=ref)
    kl = 0.5 - math.log(0.5) - 1  # exp(ref - logp) - (ref - logp) - 1
    assert stats["kl"] == pytest.approx(kl)
    assert float(loss.detach()) == pytest.approx(0.5 * kl)


def test_without_off_policy_correction_the_ratio_is_one_whatever_the_behaviour():
    cfg = LossConfig(off_policy_correction="none")
    for ratio, adv in [(4.0, -1.0), (1.5, 1.0), (0.5, -1.0), (1.0, 2.0)]:
        got_loss, got_grad, stats = _one_token(ratio, adv, cfg)
        assert got_loss == pytest.approx(-adv) and got_grad == pytest.approx(-adv)  # A x grad log pi
        assert stats["clip_fraction"] == 0 and stats["truncated_fraction"] == 0 and stats["mean_ratio"] == 1
    # The default corrects (weight min(r, C) = 2 here) and is left out of the encoding, so run
    # specs written before the switch existed encode (and hash) the same.
    assert _one_token(4.0, -1.0)[1] == pytest.approx(2.0)
    assert "off_policy_correction" not in LossConfig().model_dump()
    assert LossConfig().model_dump_json() == (
        '{"clip_low":0.2,"clip_high":0.28,"is_cap":2.0,"kl_coef":0.0,"temperature":1.0}')
    assert cfg.model_dump()["off_policy_correction"] == "none"
    assert LossConfig.model_validate_json(cfg.model_dump_json()) == cfg
