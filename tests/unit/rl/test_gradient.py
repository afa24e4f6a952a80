import torch
from rl_tiny import EOS, PAD, two_shards

from krill.rl.advantages import contiguous_groups, group_advantages
from krill.rl.batch import learner_batch, token_logprobs
from krill.rl.engine import HFEngine, SamplingParams
from krill.rl.gradient import shard_gradients
from krill.rl.loss import LossConfig, policy_loss
from krill.rl.optimizer import AdamWConfig, ShardAdamW

PROMPTS = [[2, 5, 6], [2, 7, 3]]
G = 4


def _batch(model, seed=0):
    engine = HFEngine(model, eos_id=EOS, pad_id=PAD)
    prompts = [p for p in PROMPTS for _ in range(G)]
    rollouts = engine.generate(prompts, SamplingParams(max_new_tokens=6), seed=seed)
    # a fixed, non-degenerate reward: completions that contain token 7 are "right"
    rewards = torch.tensor([float(7 in rollouts.completion(i)) for i in range(len(rollouts))])
    rewards[0], rewards[G] = 1.0 - rewards[1], 1.0 - rewards[G + 1]  # every group has variance
    return rollouts, group_advantages(rewards, contiguous_groups(len(rewards), G))


def test_one_step_moves_every_parameter_of_the_trained_shard_only(model):
    rollouts, adv = _batch(model)
    shards = two_shards(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = shard_gradients(model, rollouts, adv, {1: shards[1]}, LossConfig(), pad_id=PAD)
    assert set(result.grads) == {1} and set(result.grads[1]) == set(shards[1])
    params = dict(model.named_parameters())
    opt = ShardAdamW({n: params[n].data for n in shards[1]}, AdamWConfig(lr=1e-3))
    opt.step(result.grads[1])
    for n, p in model.named_parameters():
        moved = bool((p.detach() != before[n]).any())
        assert moved == (n in shards[1]), n
        if n in shards[1]:
            assert bool((p.detach() != before[n]).all()), f"{n}: some coordinates did not move"
    assert all(p.requires_grad for p in model.parameters())  # flags restored


def test_shard_gradients_equal_full_gradient_and_skip_zero_advantage(model):
    rollouts, adv = _batch(model)
    adv[G:] = 0.0  # the second group carries no signal: skipped, but its tokens still normalise
    shards = two_shards(model)
    result = shard_gradients(model, rollouts, adv, shards, LossConfig(), pad_id=PAD)
    batch = learner_batch(rollouts, PAD)
    model.zero_grad()
    loss, _ = policy_loss(token_logprobs(model, batch), batch.behaviour, adv, batch.mask, LossConfig())
    loss.backward()
    assert abs(result.loss - float(loss.detach())) < 1e-6
    for shard, names in shards.items():
        for n in names:
            full = dict(model.named_parameters())[n].grad
            assert torch.allclose(result.grads[shard][n], full, atol=1e-6, rtol=1e-4), n


def test_loss_decreases_on_a_fixed_batch(model):
    rollouts, adv = _batch(model, seed=1)
    shards = two_shards(model)
    names = shards[0] + shards[1]
    params = dict(model.named_parameters())
    opt = ShardAdamW({n: params[n].data for n in names}, AdamWConfig(lr=3e-3, max_grad_norm=None))
    losses = []
    for _ in range(5):
        result = shard_gradients(model, rollouts, adv, {0: names}, LossConfig(), pad_id=PAD)
        losses.append(result.loss)
        opt.step(result.grads[0])
    assert losses[-1] < losses[0] - 0.05, losses


def test_kl_term_counts_the_sequences_of_flat_groups_too(model):
    """The KL penalty pulls on every token: a flat group (zero advantage) still carries its share, so
    shard_gradients may not skip it when the loss has a KL term."""
    from rl_tiny import tiny_llama

    ref = tiny_llama(seed=1)
    rollouts, adv = _batch(model)
    shards = two_shards(model)
    config = LossConfig(kl_coef=0.5)
    for flat in (slice(G, None), slice(None)):  # one flat group; every group flat
        adv = adv.clone()
        adv[flat] = 0.0
        result = shard_gradients(model, rollouts, adv, shards, config, pad_id=PAD, ref_model=ref)
        batch = learner_batch(rollouts, PAD)
        model.zero_grad()
        with torch.no_grad():
            ref_logp = token_logprobs(ref, batch)
        loss, _ = policy_loss(token_logprobs(model, batch), batch.behaviour, adv, batch.mask, config,
                              ref_logprobs=ref_logp)
        loss.backward()
        assert abs(result.loss - float(loss.detach())) < 1e-6
        params = dict(model.named_parameters())
        for shard, names in shards.items():
            for n in names:
                assert torch.allclose(result.grads[shard][n], params[n].grad, atol=1e-6, rtol=1e-4), n
        model.zero_grad()
