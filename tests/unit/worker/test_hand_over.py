"""The behaviour engine takes over the learner's model when the learner holds the version it needs."""

from krill.model.build import TinyModelSpec, build_tiny_model
from krill.rl.engine.base import SamplingParams
from krill.rl.engine.hf import HFEngine
from krill.worker.source import BehaviourPolicy, LearnerPolicy, hand_over


def _policies(tmp_path, engine_version: int, learner_version: int):
    from transformers import AutoModelForCausalLM

    build_tiny_model(seed=0, spec=TinyModelSpec(hidden=16, layers=1, heads=2, intermediate=32), directory=tmp_path)
    behaviour, learner = BehaviourPolicy(source=None), LearnerPolicy(source=None)
    behaviour.engine = HFEngine(AutoModelForCausalLM.from_pretrained(tmp_path), eos_id=0, pad_id=0,
                                version=engine_version)
    learner.model, learner.version = AutoModelForCausalLM.from_pretrained(tmp_path).train(), learner_version
    return behaviour, learner


def test_the_models_trade_places_when_the_learner_holds_the_wanted_version(tmp_path):
    behaviour, learner = _policies(tmp_path, engine_version=3, learner_version=4)
    engine_model, learner_model = behaviour.engine.model, learner.model
    assert hand_over(behaviour, learner, 4)
    assert behaviour.engine.model is learner_model and behaviour.engine.version == 4
    assert not behaviour.engine.model.training  # the engine samples in eval mode whatever it was handed
    assert learner.model is engine_model and learner.version == 3
    assert all(p.grad is None for p in learner.model.parameters())
    out = behaviour.engine.generate([[1, 2, 3]], SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=2), seed=0)
    assert len(out.sequences()) == 1 and out.sequence(0)[:3] == [1, 2, 3]


def test_no_trade_when_the_engine_has_the_version_or_the_learner_does_not(tmp_path):
    behaviour, learner = _policies(tmp_path, engine_version=4, learner_version=4)
    before = (behaviour.engine.model, learner.model)
    assert not hand_over(behaviour, learner, 4)
    assert not hand_over(behaviour, learner, 5)
    assert (behaviour.engine.model, learner.model) == before and learner.version == 4
    empty = LearnerPolicy(source=None)
    assert not hand_over(behaviour, empty, 4)
