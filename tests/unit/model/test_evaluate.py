"""Generation and evaluation: deterministic, batched like unbatched, CLI output."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from krill.commands.eval_cmd import eval_
from krill.model.build import build_tiny_model, load_model
from krill.model.evaluate import evaluate
from krill.model.generate import generate
from krill.model.tokenizer import decode_completion
from krill.rl.tasks import get_task


def test_eval_is_deterministic_and_counts_correctly(tiny_dir):
    model, tok = load_model(tiny_dir)
    task = get_task("arithmetic", 1)
    a = evaluate(model, task, 40, tokenizer=tok, k=3, seed=5)
    b = evaluate(tiny_dir, task, 40, k=3, seed=5)
    assert a == b
    assert a.n == 40 and a.k == 3 and 1 <= a.mean_length <= task.max_new_tokens
    # Recount by hand, one prompt at a time (no batching).
    hits = 0
    for i in range(40):
        text, meta = task.prompt(i, "eval")
        out = generate(model, torch.tensor([tok(text)["input_ids"]]), task.max_new_tokens,
                       tok.eos_token_id, tok.pad_token_id)
        hits += task.reward(meta, decode_completion(tok, out[0].tolist())) > 0
    assert a.accuracy == hits / 40


def test_a_model_that_knows_the_answers_scores_one(small_spec):
    """Supervise a tiny model on exactly the eval prompts until it memorises them: accuracy 1."""
    torch.manual_seed(0)
    model, tok = build_tiny_model(seed=0, spec=small_spec)
    task = get_task("arithmetic", 1)
    rows = []
    for i in range(8):
        text, meta = task.prompt(i, "eval")
        rows.append(tok(text)["input_ids"] + tok(task.reference(meta), add_special_tokens=False)["input_ids"]
                    + [tok.eos_token_id])
    ids = torch.tensor(rows)
    labels = ids.clone()
    labels[:, :7] = -100
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(150):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    result = evaluate(model, task, 8, tokenizer=tok)
    assert result.accuracy == 1.0 and result.mean_length == 4.0
    assert model.training  # restored


def test_sampling_is_reproducible_from_the_seed(tiny_dir):
    model, tok = load_model(tiny_dir)
    ids = torch.tensor([tok("12+34+56=")["input_ids"]] * 16)
    runs = [generate(model, ids, 6, tok.eos_token_id, tok.pad_token_id, temperature=1.0,
                     generator=torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


def test_evaluate_needs_a_tokenizer_with_a_loaded_model(tiny_dir):
    from krill.errors import ModelError

    model, _ = load_model(tiny_dir)
    with pytest.raises(ModelError, match="tokenizer"):
        evaluate(model, get_task(), 4)


def test_eval_command_json(tiny_dir):
    result = CliRunner().invoke(eval_, ["--model", str(tiny_dir), "--task", "arithmetic:1", "--n", "20",
                                        "--k", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["task"] == "arithmetic:1" and data["n"] == 20 and data["k"] == 2
    again = CliRunner().invoke(eval_, ["--model", str(tiny_dir), "--task", "arithmetic:1", "--n", "20",
                                       "--k", "2", "--json"])
    assert again.stdout == result.stdout
    text = CliRunner().invoke(eval_, ["--model", str(tiny_dir), "--task", "countdown:3", "--n", "10"])
    assert text.exit_code == 0 and "greedy accuracy" in text.stdout
