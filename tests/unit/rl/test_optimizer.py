import math

import pytest
import torch

from krill.rl.optimizer import AdamWConfig, OptimizerError, ShardAdamW


def test_first_step_matches_hand_computation_and_torch():
    cfg = AdamWConfig(lr=0.1, weight_decay=0.01, max_grad_norm=None)
    p = {"w": torch.tensor([1.0, -2.0])}
    g = {"w": torch.tensor([0.5, -4.0])}
    ShardAdamW(p, cfg).step(g)
    # step 1: m_hat = g, v_hat = g^2, update = lr * g / (|g| + eps) = 0.1 * sign(g); decay first
    expected = torch.tensor([1.0 * (1 - 0.001) - 0.1, -2.0 * (1 - 0.001) + 0.1])
    assert torch.allclose(p["w"], expected, atol=1e-6)
    ref = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    topt = torch.optim.AdamW([ref], lr=0.1, weight_decay=0.01)
    p2 = {"w": torch.tensor([1.0, -2.0])}
    opt = ShardAdamW(p2, cfg)
    for step in range(3):
        grad = torch.tensor([0.5, -4.0]) * (step + 1)
        ref.grad = grad.clone()
        topt.step()
        opt.step({"w": grad})
    assert torch.allclose(p2["w"], ref.detach(), atol=1e-6)


def test_grad_norm_clipping():
    p = {"a": torch.zeros(1), "b": torch.zeros(1)}
    opt = ShardAdamW(p, AdamWConfig(lr=1.0, max_grad_norm=1.0))
    norm = opt.step({"a": torch.tensor([3.0]), "b": torch.tensor([4.0])})
    assert norm == 5.0
    assert torch.allclose(opt.exp_avg["a"], torch.tensor([0.1 * 3 / 5]))


def test_state_round_trip_resumes_bit_exactly():
    torch.manual_seed(0)
    grads = [{"x": torch.randn(3, 4), "y": torch.randn(5)} for _ in range(4)]
    cfg = AdamWConfig(lr=1e-2)
    a = {"x": torch.ones(3, 4), "y": torch.zeros(5)}
    opt_a = ShardAdamW(a, cfg)
    for g in grads:
        opt_a.step(g)
    b = {"x": torch.ones(3, 4), "y": torch.zeros(5)}
    opt_b = ShardAdamW(b, cfg)
    for g in grads[:2]:
        opt_b.step(g)
    blob = opt_b.state_bytes()
    c = {k: v.clone() for k, v in b.items()}
    opt_c = ShardAdamW(c, cfg)
    opt_c.load_state_bytes(blob)
    assert opt_c.step_count == 2
    for g in grads[2:]:
        opt_c.step(g)
    assert all(torch.equal(a[k], c[k]) for k in a)
    with pytest.raises(OptimizerError, match="different AdamW config"):
        ShardAdamW(dict(c), AdamWConfig(lr=0.5)).load_state_bytes(blob)
    with pytest.raises(OptimizerError, match="names"):
        ShardAdamW({"x": torch.ones(3, 4)}, cfg).load_state_bytes(blob)


def test_mismatched_gradients_rejected():
    opt = ShardAdamW({"w": torch.zeros(2)}, AdamWConfig())
    with pytest.raises(OptimizerError, match="names"):
        opt.step({"v": torch.zeros(2)})
    with pytest.raises(OptimizerError, match="shape"):
        opt.step({"w": torch.zeros(3)})
    assert not math.isnan(opt.step({"w": torch.zeros(2)}))


def test_a_malformed_state_blob_is_an_optimizer_error_and_changes_nothing():
    import json

    import pytest
    from safetensors.torch import save as st_save

    from krill.errors import ModelError
    from krill.protocol.state import momentum_from_state
    from krill.rl.optimizer import AdamWConfig, OptimizerError, ShardAdamW

    params = {"w": torch.zeros(3)}
    good = ShardAdamW(params, AdamWConfig())
    good.step({"w": torch.ones(3)})
    blob = good.state_bytes()
    meta = json.loads(json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])["__metadata__"]["krill-adamw"])
    tensors = {"m/w": torch.ones(3), "v/w": torch.ones(3)}

    def with_meta(**changes):
        return st_save(tensors, metadata={"krill-adamw": json.dumps({**meta, **changes})})

    bad = {b"not safetensors": "not a valid safetensors file",
           with_meta(step="x"): "step 'x' is not an integer",
           with_meta(config="{"): "AdamW config is unreadable",
           st_save({"m/w": torch.ones(3), "x/w": torch.ones(3)},
                   metadata={"krill-adamw": json.dumps(meta)}): "parameter names differ",
           st_save({"m/w": torch.ones(3), "v/w": torch.ones(4)},
                   metadata={"krill-adamw": json.dumps(meta)}): r"v/w has shape \(4,\)"}
    for data, why in bad.items():
        fresh = ShardAdamW(params, AdamWConfig())
        with pytest.raises(OptimizerError, match=why):
            fresh.load_state_bytes(data)
        assert fresh.step_count == 0 and not any(t.any() for t in fresh.exp_avg.values())
    with pytest.raises(ModelError, match="not a valid safetensors file"):
        momentum_from_state(b"garbage")


def test_each_product_is_rounded_on_its_own_so_every_cpu_gets_the_same_bits():
    """torch's AVX2/AVX-512 kernels fuse `add_(g, alpha=)` and `addcmul_` into multiply-adds, its generic kernel
    does not: the fold's bits differed between a coordinator's CPU and an auditor's. The step now equals the
    unfused formula computed op by op, bit for bit (and a state of the fused arithmetic is refused by name)."""
    import json

    from safetensors.torch import save as st_save

    torch.manual_seed(3)
    cfg = AdamWConfig(lr=1e-3, weight_decay=0.01, max_grad_norm=None)
    p, grads = {"w": torch.randn(4097)}, [torch.randn(4097) for _ in range(3)]
    ref_p, m, v = p["w"].clone(), torch.zeros(4097), torch.zeros(4097)
    opt = ShardAdamW(p, cfg)
    for step, g in enumerate(grads, 1):
        opt.step({"w": g})
        m = m * cfg.beta1 + g * (1.0 - cfg.beta1)
        v = v * cfg.beta2 + g * g * (1.0 - cfg.beta2)
        ref_p = ref_p * (1.0 - cfg.lr * cfg.weight_decay)
        denom = (v / (1.0 - cfg.beta2 ** step)).sqrt() + cfg.eps
        ref_p = ref_p - m / denom * (cfg.lr / (1.0 - cfg.beta1 ** step))
    assert torch.equal(p["w"], ref_p) and torch.equal(opt.exp_avg["w"], m) and torch.equal(opt.exp_avg_sq["w"], v)
    old = st_save({"m/w": m, "v/w": v}, metadata={"krill-adamw": json.dumps(
        {"format": "krill-adamw/1", "step": "3", "config": cfg.model_dump_json()})})
    with pytest.raises(OptimizerError, match="krill-adamw/1, made by an older Krill"):
        ShardAdamW({"w": torch.zeros(4097)}, cfg).load_state_bytes(old)
