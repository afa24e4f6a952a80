import pytest
import torch
from rl_tiny import EOS, PAD, tiny_llama, two_shards

from krill.rl.advantages import contiguous_groups, group_advantages
from krill.rl.engine import HFEngine, SamplingParams
from krill.rl.gradient import shard_gradients
from krill.rl.grouped_gradient import GroupedGradientError, grouped_shard_gradients
from krill.rl.loss import LossConfig

G = 4


def _work(model, prompts, seed, zero_groups=()):
    engine = HFEngine(model, eos_id=EOS, pad_id=PAD)
    rollouts = engine.generate([p for p in prompts for _ in range(G)], SamplingParams(max_new_tokens=5), seed=seed)
    rewards = torch.tensor([float(7 in rollouts.completion(i)) for i in range(len(rollouts))])
    for g in range(len(prompts)):
        rewards[g * G] = 1.0 - rewards[g * G + 1]  # every group has variance
    adv = group_advantages(rewards, contiguous_groups(len(rewards), G))
    for g in zero_groups:
        adv[g * G:(g + 1) * G] = 0.0
    return rollouts, adv


def test_grouped_gradients_equal_one_pass_per_worker():
    model = tiny_llama(seed=3)
    shards = two_shards(model)
    work = [
        _work(model, [[2, 5, 6], [2, 7, 3, 9, 4]], seed=0),  # prompts of different lengths
        _work(model, [[2, 8]], seed=1),  # fewer prompts and rows
        _work(model, [[2, 5, 6], [2, 3]], seed=2, zero_groups=(0, 1)),  # nothing to learn
        _work(model, [[2, 9, 9, 9, 9, 9, 4], [2, 4], [2, 6, 6]], seed=3, zero_groups=(1,)),
    ]
    before = model(input_ids=torch.tensor([[2, 5, 6]])).logits
    grouped = grouped_shard_gradients(model, work, shards, LossConfig(), PAD)
    for (rollouts, adv), got in zip(work, grouped, strict=True):
        want = shard_gradients(model, rollouts, adv, shards, LossConfig(), pad_id=PAD)
        assert got.loss == pytest.approx(want.loss, abs=1e-6)
        assert got.stats == pytest.approx(want.stats, abs=1e-6)
        for shard, names in shards.items():
            for name in names:
                assert torch.allclose(got.grads[shard][name], want.grads[shard][name], atol=1e-6, rtol=1e-4), name
    assert all(not bool(got.grads[s][n].any()) for s in shards for n in shards[s] for got in grouped[2:3])
    # the model is left as found: own forwards, flags, no gradients
    assert all(p.requires_grad and p.grad is None for p in model.parameters())
    assert not any("forward" in vars(m) for m in model.modules())
    assert torch.equal(model(input_ids=torch.tensor([[2, 5, 6]])).logits, before)


def test_a_model_the_pass_cannot_split_is_refused_and_left_as_found():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=16, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                      intermediate_size=64, eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    work = [_work(model, [[2, 5, 6]], seed=0)]
    shards = {0: [n for n, _ in model.named_parameters()]}
    with pytest.raises(GroupedGradientError, match="tied"):
        grouped_shard_gradients(model, work, shards, LossConfig(), PAD)
    with pytest.raises(GroupedGradientError, match="KL"):
        grouped_shard_gradients(tiny_llama(), work, two_shards(tiny_llama()), LossConfig(kl_coef=0.1), PAD)
    assert not any("forward" in vars(m) for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())
