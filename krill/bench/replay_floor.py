"""What a replay check cannot go below, and what checking part of a batch would cost the worker.

Design decisions:
- In process, on one torch thread and one contribution of the demo's shape (its prompts x G
  samples at the task's completion length, sampled once with a fixed seed from the model under
  test), so the figures are the model's own work without the protocol or other processes:
  - the worker's two passes: generation, and the gradient of every shard in one backward pass;
  - the verifier's two: the teacher-forced pass that confirms the draws, and one shard's
    gradient (each shard of the run's plan: a shard low in the model still needs the whole
    backward pass);
  - the same two on one group's rows only (what a check of one group in G would recompute);
  - the worker's gradient with each group's weight gradient kept apart in one pass
    (`krill.rl.grouped_gradient`, the groups as its workers): what per-group gradient claims,
    the commitments a one-group check would compare against, cost the worker to compute.
- Medians of `repeats` timings after one warm-up each; random advantages (the cost does not
  depend on them, only on which rows are nonzero, and none are zero here).
- Ratios follow the bench's convention: the verifier's time over the worker's production
  (generation + gradient; reward and packaging are a few ms and left out here).
- By completion length (`by_completion_length`): the same four passes on a random model of the
  model's shape, whose samples rarely end early, at several completion caps. The task's answers
  are a few tokens; this shows whether longer generations (where generation is the larger part of
  the worker's work) would bring the check under its target, and which of the verifier's two
  passes keeps it above.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from krill.protocol.step import one_thread


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times)


def _every_shard(model, num_shards: int) -> dict:
    """Shard index -> its parameter names, as the run's plan splits `model`."""
    from krill.model.shards import num_layers_of, plan_shards

    names = [n for n, _ in model.named_parameters()]
    return dict(enumerate(plan_shards(names, num_layers_of(model.config.to_dict(), names), num_shards)))


def _rows(rollouts, rows: list[int]):
    """The sub-batch of `rollouts` holding `rows`, in the flat layout."""
    from krill.rl.engine.base import Rollouts

    tokens, logprobs, offsets = [], [], [0]
    for i in rows:
        a, b = int(rollouts.offsets[i]), int(rollouts.offsets[i + 1])
        tokens.append(rollouts.tokens[a:b])
        logprobs.append(rollouts.logprobs[a:b])
        offsets.append(offsets[-1] + b - a)
    return Rollouts(tokens=torch.cat(tokens), offsets=torch.tensor(offsets), prompt_lengths=rollouts.prompt_lengths[rows],
                    logprobs=torch.cat(logprobs), finished=rollouts.finished[rows])


def measure(model_dir: Path, prompts: int = 16, group_size: int = 8, num_shards: int = 2, task: str = "arithmetic",
            repeats: int = 8, seed: int = 0) -> dict:
    """Median milliseconds of each pass, and the ratios they imply (see the module docstring)."""
    from krill.model.build import load_model
    from krill.rl.engine.base import SamplingParams
    from krill.rl.engine.hf import HFEngine
    from krill.rl.engine.replay import fast_path_available, replay_draws
    from krill.rl.gradient import shard_gradients
    from krill.rl.grouped_gradient import grouped_shard_gradients
    from krill.rl.loss import LossConfig
    from krill.rl.tasks import get_task

    with one_thread():
        model, tokenizer = load_model(model_dir)
        the_task = get_task(task)
        ids = [tokenizer(text)["input_ids"] for text, _ in the_task.prompts(list(range(prompts)), "train")]
        batch_prompts = [list(p) for p in ids for _ in range(group_size)]
        engine = HFEngine(model, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, version=0)
        params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=the_task.max_new_tokens)
        rollouts = engine.generate(batch_prompts, params, seed)
        every = _every_shard(model, num_shards)
        generator = torch.Generator().manual_seed(seed)
        advantages = torch.randn(len(rollouts), generator=generator)
        loss, pad = LossConfig(), tokenizer.pad_token_id
        group = _rows(rollouts, list(range(group_size)))
        groups = [(_rows(rollouts, list(range(g * group_size, (g + 1) * group_size))),
                   advantages[g * group_size:(g + 1) * group_size]) for g in range(prompts)]

        ms = {"generate": _median_ms(lambda: engine.generate(batch_prompts, params, seed), repeats),
              "gradient_all_shards": _median_ms(lambda: shard_gradients(model, rollouts, advantages, every, loss, pad),
                                                repeats),
              "teacher_forced": _median_ms(lambda: engine.logprobs(rollouts), repeats)}
        if fast_path_available():  # what the resample check runs: the teacher-forced pass plus the noise replay
            replayed = replay_draws(model, rollouts, params, seed, engine.eos_id, engine.pad_id, 1e-4)
            if not replayed.confirmed:
                raise RuntimeError("replay_floor: the seed's own draws were not confirmed")
            ms["confirm_draws"] = _median_ms(lambda: replay_draws(model, rollouts, params, seed, engine.eos_id,
                                                                  engine.pad_id, 1e-4), repeats)
        for s, shard in every.items():
            ms[f"gradient_shard_{s}"] = _median_ms(
                lambda shard=shard, s=s: shard_gradients(model, rollouts, advantages, {s: shard}, loss, pad), repeats)
        ms["teacher_forced_one_group"] = _median_ms(lambda: engine.logprobs(group), repeats)
        ms["gradient_shard_0_one_group"] = _median_ms(
            lambda: shard_gradients(model, group, advantages[:group_size], {0: every[0]}, loss, pad), repeats)
        ms["gradient_per_group_claims"] = _median_ms(
            lambda: grouped_shard_gradients(model, groups, every, loss, pad), repeats)
    worker = ms["generate"] + ms["gradient_all_shards"]
    one_shard = statistics.fmean(ms[f"gradient_shard_{s}"] for s in every)
    return {"settings": {"prompts": prompts, "group_size": group_size, "num_shards": num_shards, "task": task,
                         "repeats": repeats, "sequences": len(rollouts), "tokens": int(rollouts.tokens.numel()),
                         "completion_tokens": int(rollouts.num_completion_tokens), "threads": 1},
            "ms": ms,
            "worker_ms": worker,
            "replay_pct": 100 * (ms.get("confirm_draws", ms["teacher_forced"]) + one_shard) / worker,
            "replay_one_group_pct": 100 * (ms["teacher_forced_one_group"] + ms["gradient_shard_0_one_group"]) / worker,
            "per_group_claims_gradient_x": ms["gradient_per_group_claims"] / ms["gradient_all_shards"]}


def by_completion_length(spec, lengths: tuple[int, ...], prompts: int = 16, group_size: int = 8, num_shards: int = 2,
                         task: str = "arithmetic", repeats: int = 4, seed: int = 0) -> list[dict]:
    """Per completion cap in `lengths`: the worker's generation and gradient, and the verifier's
    confirmation of the draws and one shard's gradient (the mean over shards), in median ms, on a
    random model of `spec`'s shape (a `TinyModelSpec`) with room for the longest cap."""
    from dataclasses import replace

    from krill.model.build import build_tiny_model
    from krill.model.tokenizer import build_char_tokenizer
    from krill.rl.engine.base import SamplingParams
    from krill.rl.engine.hf import HFEngine
    from krill.rl.engine.replay import fast_path_available, replay_draws
    from krill.rl.gradient import shard_gradients
    from krill.rl.loss import LossConfig
    from krill.rl.tasks import get_task

    with one_thread():
        tokenizer = build_char_tokenizer()
        ids = [tokenizer(text)["input_ids"] for text, _ in get_task(task).prompts(list(range(prompts)), "train")]
        model, tokenizer = build_tiny_model(seed, replace(spec, max_positions=max(map(len, ids)) + max(lengths)))
        batch_prompts = [list(p) for p in ids for _ in range(group_size)]
        engine = HFEngine(model, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id, version=0)
        every = _every_shard(model, num_shards)
        loss, pad = LossConfig(), tokenizer.pad_token_id
        rows = []
        for length in lengths:
            params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=length)
            rollouts = engine.generate(batch_prompts, params, seed)
            advantages = torch.randn(len(rollouts), generator=torch.Generator().manual_seed(seed))
            ms = {"generate": _median_ms(lambda p=params: engine.generate(batch_prompts, p, seed), repeats),
                  "gradient_all_shards": _median_ms(
                      lambda r=rollouts, a=advantages: shard_gradients(model, r, a, every, loss, pad), repeats)}
            if fast_path_available():
                ms["confirm_draws"] = _median_ms(lambda r=rollouts, p=params: replay_draws(
                    model, r, p, seed, engine.eos_id, engine.pad_id, 1e-4), repeats)
            else:
                ms["teacher_forced"] = _median_ms(lambda r=rollouts: engine.logprobs(r), repeats)
            ms["gradient_one_shard"] = statistics.fmean(_median_ms(
                lambda r=rollouts, a=advantages, k=k: shard_gradients(model, r, a, {k: every[k]}, loss, pad), repeats)
                for k in every)
            worker = ms["generate"] + ms["gradient_all_shards"]
            resample = ms.get("confirm_draws", ms.get("teacher_forced"))
            rows.append({"max_new_tokens": length, "completion_tokens": int(rollouts.num_completion_tokens),
                         "sequences": len(rollouts), "ms": ms, "worker_ms": worker,
                         "replay_pct": 100 * (resample + ms["gradient_one_shard"]) / worker,
                         "resample_pct": 100 * resample / worker,
                         "gradient_check_x": ms["gradient_one_shard"] / ms["gradient_all_shards"]})
    return rows


def length_markdown_lines(rows: list[dict], shape: str) -> list[str]:
    """The by-completion-length table and its reading."""
    lines = ["", f"## The floor by completion length (a random model of the {shape} shape, one thread)", "",
             "| completion cap | completion tokens | worker: generation ms | worker: gradient ms | verifier: draws "
             "confirmed ms | verifier: one shard's gradient ms | replay % of the worker | of which the draws % | "
             "one shard's gradient / the worker's |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ms = r["ms"]
        lines.append(f"| {r['max_new_tokens']} | {r['completion_tokens']} | {ms['generate']:.1f} | "
                     f"{ms['gradient_all_shards']:.1f} | {ms.get('confirm_draws', ms.get('teacher_forced')):.1f} | "
                     f"{ms['gradient_one_shard']:.1f} | {r['replay_pct']:.1f}% | {r['resample_pct']:.1f}% | "
                     f"{r['gradient_check_x']:.2f}x |")
    low = min(rows, key=lambda r: r["replay_pct"])
    lines += ["", f"The lowest replay share here is {low['replay_pct']:.1f}% (cap {low['max_new_tokens']}). Recomputing "
              f"one shard's gradient costs {min(r['gradient_check_x'] for r in rows):.2f}-"
              f"{max(r['gradient_check_x'] for r in rows):.2f}x the worker's whole gradient pass (a shard low in the "
              "model needs the whole backward pass, and every shard the whole forward pass), and confirming the "
              f"draws alone is {min(r['resample_pct'] for r in rows):.1f}-{max(r['resample_pct'] for r in rows):.1f}% "
              "of the worker's work."]
    return lines


def markdown_lines(floor: dict) -> list[str]:
    """The table and the reading `krill bench verify` prints."""
    s, ms = floor["settings"], floor["ms"]
    shards = sorted(k for k in ms if k.startswith("gradient_shard_") and not k.endswith("one_group"))
    rows = [("worker: generation", ms["generate"]), ("worker: gradient, every shard in one pass", ms["gradient_all_shards"]),
            ("verifier: teacher-forced pass", ms["teacher_forced"]),
            *((("verifier: the seed's draws confirmed (resample: the pass + the noise replay)", ms["confirm_draws"]),)
              if "confirm_draws" in ms else ()),
            *((f"verifier: gradient of shard {k.rsplit('_', 1)[1]} alone", ms[k]) for k in shards),
            (f"verifier: teacher-forced pass, one group ({s['group_size']} rows)", ms["teacher_forced_one_group"]),
            ("verifier: gradient of shard 0, one group", ms["gradient_shard_0_one_group"]),
            (f"worker: gradient with per-group claims ({s['prompts']} groups' weight gradients kept apart)",
             ms["gradient_per_group_claims"])]
    lines = ["", f"## The floor, in process ({s['sequences']} sequences = {s['prompts']} prompts x {s['group_size']}, "
             f"{s['tokens']} tokens of which {s['completion_tokens']} completion, one thread, median of {s['repeats']})", "",
             "| pass | median ms |", "|---|---:|"]
    lines += [f"| {name} | {value:.1f} |" for name, value in rows]
    lines += ["", f"Replaying the whole batch (the draws confirmed + one shard's gradient, the mean over shards) is "
              f"**{floor['replay_pct']:.1f}%** of the worker's generation + gradient: the floor of this check, with no "
              f"protocol around it. Checking one group of {s['prompts']} would be {floor['replay_one_group_pct']:.1f}%, "
              f"but needs the worker to commit each group's gradient, which it computes at "
              f"{floor['per_group_claims_gradient_x']:.2f}x the cost of its plain gradient pass (before encoding, "
              f"hashing and storing {s['prompts']} times the gradient bytes)."]
    return lines
