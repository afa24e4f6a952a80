import torch
from rl_tiny import EOS, PAD, tiny_llama

from krill.rl.engine import HFEngine, Rollouts, SamplingParams
from krill.rl.engine.hf import top_p_filter

PROMPTS = [[2, 5, 6, 7], [2, 8], [2, 9, 9, 9, 9, 3]] * 3


def test_seeded_sampling_reproduces_exactly(model):
    engine = HFEngine(model, eos_id=EOS, pad_id=PAD, version=0)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=8)
    a = engine.generate(PROMPTS, params, seed=11)
    b = HFEngine(tiny_llama(), eos_id=EOS, pad_id=PAD).generate(PROMPTS, params, seed=11)
    c = engine.generate(PROMPTS, params, seed=12)
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.logprobs, b.logprobs)
    assert not torch.equal(a.tokens, c.tokens)


def test_behaviour_logprobs_match_teacher_forcing_despite_left_padding(model):
    engine = HFEngine(model, eos_id=EOS, pad_id=PAD, version=0)
    r = engine.generate(PROMPTS, SamplingParams(temperature=0.7, max_new_tokens=8), seed=3)
    replay = engine.logprobs(r, temperature=0.7)
    assert r.num_completion_tokens > len(PROMPTS)
    assert torch.allclose(replay, r.logprobs, atol=1e-5)
    for i in range(len(r)):
        assert r.sequence(i)[:len(PROMPTS[i])] == PROMPTS[i]
        comp = r.completion(i)
        assert bool(r.finished[i]) == (comp[-1] == EOS)
        assert EOS not in comp[:-1]
        assert (r.completion_logprobs(i) < 0).all()


def test_generate_groups_gives_each_group_what_it_gets_alone(model):
    engine = HFEngine(model, eos_id=EOS, pad_id=PAD, version=0)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_new_tokens=8)
    groups = [(PROMPTS, 11), ([[2, 8]], 2), ([[2, 9, 9], [2, 5, 6, 7]] * 2, 11), ([[2, 8]], 3)]
    together = engine.generate_groups(groups, params)
    for (prompts, seed), got in zip(groups, together, strict=True):
        alone = engine.generate(prompts, params, seed=seed)
        assert torch.equal(got.tokens, alone.tokens) and torch.equal(got.offsets, alone.offsets)
        assert torch.allclose(got.logprobs, alone.logprobs, atol=1e-6)
    assert [int(g.completion_lengths().max()) for g in together][1::2] == [1, 4]  # groups stop at different steps


def test_prefix_shared_logprobs_equal_the_full_sequence_pass(model):
    from krill.rl.batch import completion_batch, completion_logprobs, learner_batch, token_logprobs

    engine = HFEngine(model, eos_id=EOS, pad_id=PAD, version=0)
    r = engine.generate(PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=8), seed=4)
    shared = completion_logprobs(model, completion_batch(r, PAD), 0.8)
    full = token_logprobs(model, learner_batch(r, PAD), 0.8)
    assert shared.shape[0] == len(r) and completion_batch(r, PAD).prompt_ids.shape[0] == 3  # 3 distinct prompts
    for i in range(len(r)):
        n, p = len(r.completion(i)), len(PROMPTS[i])
        assert torch.allclose(shared[i, :n], full[i, p - 1:p - 1 + n], atol=1e-6)
        assert (shared[i, n:] == 0).all()


def test_greedy_is_argmax_of_teacher_forced_logits(model):
    engine = HFEngine(model, eos_id=EOS, pad_id=PAD)
    r = engine.generate([[2, 5, 6]], SamplingParams(temperature=0.0, max_new_tokens=5), seed=0)
    seq = [2, 5, 6]
    for _ in r.completion(0):
        logits = model(input_ids=torch.tensor([seq])).logits[0, -1]
        seq.append(int(torch.argmax(logits)))
    assert r.sequence(0) == seq[:len(r.sequence(0))]


def test_load_state_dict_switches_version_and_weights(model):
    engine = HFEngine(model, eos_id=EOS, pad_id=PAD, version=0)
    other = tiny_llama(seed=5)
    engine.load_state_dict({k: v.clone() for k, v in other.state_dict().items()}, version=7)
    assert engine.version == 7
    p = SamplingParams(max_new_tokens=6)
    assert torch.equal(engine.generate(PROMPTS, p, 1).tokens,
                       HFEngine(other, eos_id=EOS, pad_id=PAD).generate(PROMPTS, p, 1).tokens)


def test_top_p_keeps_smallest_prefix_with_enough_mass():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.allclose(top_p_filter(probs, 0.7), torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    assert torch.allclose(top_p_filter(probs, 0.4), torch.tensor([[1.0, 0.0, 0.0, 0.0]]))


def test_rollouts_flat_layout_round_trip():
    r = Rollouts.from_lists([[2, 3], [2]], [[4, 1], [5, 6]], [[-0.5, -0.25], [-1.0, -2.0]], [True, False])
    assert r.offsets.tolist() == [0, 4, 7]
    assert r.completion(1) == [5, 6] and r.completion_lengths().tolist() == [2, 2]
    assert r.logprobs.tolist() == [0.0, 0.0, -0.5, -0.25, 0.0, -1.0, -2.0]
    both = Rollouts.concat([r, r])
    assert both.offsets.tolist() == [0, 4, 7, 11, 14] and both.sequence(3) == [2, 5, 6]


def _huge(name: str, scale: float, seed: int = 3):
    """A tiny model whose parameter `name` is scaled to `scale` at most: every weight finite."""
    model = tiny_llama(seed=seed)
    with torch.no_grad():
        p = dict(model.named_parameters())[name]
        p.mul_(scale / p.abs().max())
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return model


def test_finite_weights_that_overflow_the_logits_raise_the_engines_error_not_torchs_or_nan():
    """A published version can hold finite but huge weights (its final norm at 3e38): sampling raised torch's
    RuntimeError, which no caller could tell from a bug, greedy decoding returned NaN log-probs, and the
    teacher-forced pass NaN ones. Each now raises `NonFiniteLogitsError`, an `EngineError`."""
    import pytest

    from krill.rl.engine import EngineError, NonFiniteLogitsError

    sane = HFEngine(tiny_llama(seed=3), eos_id=EOS, pad_id=PAD)
    claimed = sane.generate([[2, 5, 6]] * 4, SamplingParams(max_new_tokens=5), 0)
    engine = HFEngine(_huge("model.norm.weight", 3e38), eos_id=EOS, pad_id=PAD, version=7)
    for params in (SamplingParams(max_new_tokens=5), SamplingParams(temperature=0.0, max_new_tokens=5),
                   SamplingParams(temperature=0.5, top_p=0.9, max_new_tokens=5)):
        with pytest.raises(NonFiniteLogitsError, match="version 7: the weights give non-finite logits"):
            engine.generate(PROMPTS, params, seed=0)
    with pytest.raises(NonFiniteLogitsError, match="teacher-forced"):
        engine.logprobs(claimed)
    assert issubclass(NonFiniteLogitsError, EngineError)


def test_huge_weights_whose_logits_stay_finite_still_sample_and_score():
    """Large but not overflowing logits (lm_head at 1e30) are a usable, if degenerate, policy: no error."""
    engine = HFEngine(_huge("lm_head.weight", 1e30), eos_id=EOS, pad_id=PAD, version=7)
    r = engine.generate(PROMPTS, SamplingParams(max_new_tokens=5), seed=0)
    assert bool(torch.isfinite(r.logprobs).all()) and bool(torch.isfinite(engine.logprobs(r)).all())
