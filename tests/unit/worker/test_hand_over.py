"""The behaviour engine takes over the learner's model when the learner holds the version it needs."""

from krill.model.build import TinyModelSpec, build_tiny_model
from krill.rl.engine.base import SamplingParams
from krill.rl.engine.hf import HFEngine
from krill.worker.source import BehaviourPolicy, LearnerPolicy


def _policies(tmp_path, engine_version: int, learner_version: int):
    from transformers import AutoModelForCausalLM

    build_tiny_model(seed=0, spec=TinyModelSpec(hidden=16, layers=1, heads=2, intermediate=32), directory=tmp_path)
    learner = LearnerPolicy(source=None)
    behaviour = BehaviourPolicy(source=None, learner=learner)
    behaviour.engine = HFEngine(AutoModelForCausalLM.from_pretrained(tmp_path), eos_id=0, pad_id=0,
                                version=engine_version)
    learner.model, learner.version = AutoModelForCausalLM.from_pretrained(tmp_path).train(), learner_version
    return behaviour, learner


def test_the_models_trade_places_when_the_learner_holds_the_wanted_version(tmp_path):
    behaviour, learner = _policies(tmp_path, engine_version=3, learner_version=4)
    engine_model, learner_model = behaviour.engine.model, learner.model
    assert behaviour.hand_over(4)
    assert behaviour.engine.model is learner_model and behaviour.engine.version == 4
    assert not behaviour.engine.model.training  # the engine samples in eval mode whatever it was handed
    assert learner.model is engine_model and learner.version == 3
    assert all(p.grad is None for p in learner.model.parameters())
    out = behaviour.engine.generate([[1, 2, 3]], SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=2), seed=0)
    assert len(out.sequences()) == 1 and out.sequence(0)[:3] == [1, 2, 3]


def test_no_trade_when_the_engine_has_the_version_or_the_learner_does_not(tmp_path):
    behaviour, learner = _policies(tmp_path, engine_version=4, learner_version=4)
    before = (behaviour.engine.model, learner.model)
    assert not behaviour.hand_over(4)
    assert not behaviour.hand_over(5)
    assert (behaviour.engine.model, learner.model) == before and learner.version == 4
    behaviour.learner = LearnerPolicy(source=None)  # holds no model yet
    assert not behaviour.hand_over(4)
    behaviour.learner = None  # an engine without a learner to take from
    assert not behaviour.hand_over(4)


def test_at_takes_the_learners_model_instead_of_loading_weights(tmp_path):
    class Source:  # the version look-up `at` makes; loading weights from it would fail the test
        def version(self, version):
            return self

        def all_tensors(self):
            raise AssertionError("the engine loaded weights it could take from the learner")

    behaviour, learner = _policies(tmp_path, engine_version=3, learner_version=4)
    behaviour.source = Source()
    learner_model = learner.model
    assert behaviour.at(4) is behaviour.engine and behaviour.engine.model is learner_model
    assert behaviour.engine.version == 4 and learner.version == 3
