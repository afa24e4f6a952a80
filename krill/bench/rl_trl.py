"""The TRL side of `krill bench rl`: Hugging Face TRL's GRPOTrainer on Krill's model and task.

Design decisions:
- Imported only when TRL is installed (the optional extra `krill[bench]`, TRL 1.16); nothing
  else in Krill imports it.
- Settings matched to `krill train local` (see `krill.bench.rl_compare`): one generation batch
  of prompts x G completions per optimizer step (`steps_per_generation=1`,
  `num_iterations=1`: on-policy, as TRL defaults), `scale_rewards="none"` (advantage = reward -
  group mean), `loss_type="dapo"` (token-level: the sum over completion tokens divided by their
  number in the batch), `beta=0` (no KL, no reference model), clip 0.2 / 0.28 as Krill's loss,
  constant learning rate without warm-up, AdamW with Krill's betas, eps and no weight decay,
  gradient-norm clip 1, fp32 (`bf16=False`: TRL turns bf16 on by default), no gradient
  checkpointing (on by default in TRL), `use_vllm=False`, CPU, no logging, no checkpoints.
- The dataset is built locally (`datasets.Dataset.from_list`) from the task's train prompts
  0..dataset_size-1 (text, and the metadata as JSON for the reward); TRL tokenises the text
  with the model's own tokenizer, which adds the same bos as Krill's workers do.
- The reward is the task's strict reward on `decode_completion` of the completion's token ids
  (text before the first eos), exactly what Krill's workers and evaluation score.
- A callback drives the shared `RunClock`: it starts the clock when training begins, evaluates
  at the checkpoints and stops training when the time (or step) budget is spent.
"""

from __future__ import annotations

import json
import tempfile
import time
import warnings
from pathlib import Path


def train_dataset(task, n: int):
    """The task's train prompts 0..n-1 as a `datasets.Dataset` with `prompt` and `meta` (JSON) columns."""
    from datasets import Dataset

    rows = []
    for i in range(n):
        text, meta = task.prompt(i, "train")
        rows.append({"prompt": text, "meta": json.dumps(meta, sort_keys=True)})
    return Dataset.from_list(rows)


def task_reward(task, tokenizer, rewards: list[float]):
    """A TRL reward function scoring completions with the task's reward; batch means go to `rewards`."""
    from krill.model.tokenizer import decode_completion

    def reward(prompts, completions, completion_ids, meta, **_):
        out = [task.reward(json.loads(m), decode_completion(tokenizer, ids))
               for m, ids in zip(meta, completion_ids, strict=True)]
        rewards.append(sum(out) / len(out))
        return out

    reward.__name__ = f"{task.name}_reward"
    return reward


def grpo_config(size, seed: int, max_completion_length: int, output_dir: str):
    """TRL's GRPOConfig with the matched settings."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=output_dir, seed=seed, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        per_device_train_batch_size=size.workers * size.prompts_per_worker * size.group_size,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        num_generations=size.group_size, max_completion_length=max_completion_length, temperature=1.0, top_p=1.0,
        learning_rate=size.lr, lr_scheduler_type="constant", warmup_steps=0, adam_beta1=0.9, adam_beta2=0.999,
        adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0,
        beta=0.0, scale_rewards="none", loss_type="dapo", epsilon=0.2, epsilon_high=0.28,
        use_vllm=False, max_steps=size.max_steps or 10**9, logging_steps=10**9, save_strategy="no",
        report_to="none", disable_tqdm=True, dataloader_num_workers=0)


def run_trl(model_dir: Path, size, seed: int, clock_cls) -> dict:
    """One TRL run on the shared clock (`clock_cls` is `krill.bench.rl_compare.RunClock`)."""
    import torch
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from krill.model.build import load_model
    from krill.rl.tasks import get_task

    class _Clock(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **_):
            clock.start(model)

        def on_step_end(self, args, state, control, model=None, **_):
            if clock.after_step(model, state.global_step):
                control.should_training_stop = True

    started = time.perf_counter()
    task = get_task(size.task)
    model, tokenizer = load_model(model_dir, dtype=torch.float32)
    clock = clock_cls(task, tokenizer, size)
    rewards: list[float] = []
    with tempfile.TemporaryDirectory(prefix="krill-bench-trl-") as out, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        trainer = GRPOTrainer(model=model, reward_funcs=task_reward(task, tokenizer, rewards),
                              args=grpo_config(size, seed, task.max_new_tokens, out),
                              train_dataset=train_dataset(task, size.dataset_size), processing_class=tokenizer,
                              callbacks=[_Clock()])
        trainer.remove_callback(PrinterCallback)  # it prints TRL's metrics on stdout (breaks --json)
        setup = time.perf_counter() - started
        trainer.train()
    return clock.record("trl", seed, trainer.state.global_step, rewards, setup)
