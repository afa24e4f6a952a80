import pytest
import torch

from krill.rl.advantages import AdvantageError, contiguous_groups, group_advantages


def test_reward_minus_group_mean_and_flat_groups_are_zero():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    adv = group_advantages(rewards, contiguous_groups(8, 4))
    assert adv.tolist() == [0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 0.0]


def test_std_scaling():
    rewards = torch.tensor([1.0, 0.0, 2.0, 2.0])
    adv = group_advantages(rewards, torch.tensor([0, 0, 1, 1]), scale_by_std=True, eps=0.0)
    assert adv.tolist() == [1.0, -1.0, 0.0, 0.0]  # group 0: mean 0.5, std 0.5


def test_bad_groups_rejected():
    with pytest.raises(AdvantageError, match="group_size"):
        contiguous_groups(7, 4)
    with pytest.raises(AdvantageError, match="NaN"):
        group_advantages(torch.tensor([float("nan"), 1.0]), torch.tensor([0, 0]))
