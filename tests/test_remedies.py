"""Remedies in the job's framework's words (profiler.analysis.remedies): the
framework read from the trace's metadata as the collection layer writes it,
and every phrase free of the other framework's API."""

from __future__ import annotations

import re

import pytest

from profiler.analysis import remedies as R
from profiler.collect import facts, tf_hooks

TORCH_WORDS = re.compile(r"torch|DataLoader|DistributedSampler|drop_last|synchronize polls")
TF_WORDS = re.compile(r"\btf\.|TensorFlow|tf\.data|DistributedGradientTape|drop_remainder")


@pytest.mark.parametrize("mark", [tf_hooks.KERAS_MARK, tf_hooks.FUNCTION_MARK,
                                  tf_hooks.EAGER_MARK,
                                  f"{tf_hooks.FUNCTION_MARK}; {tf_hooks.NO_IMAGES}"])
def test_tensorflow_marks_name_tensorflow(mark: str) -> None:
    # a rank of the job that imported torch as well: its steps say TensorFlow
    meta = {"steps_marked_by": [mark], "ranks": [{"rank": 0, "cpu": {"torch_threads": 2}}]}
    assert R.framework(meta) == "tensorflow"


def test_pytorch_and_unknown_jobs() -> None:
    assert R.framework({"steps_marked_by": [facts.STEP_MARKERS["hook"]]}) == "pytorch"
    # steps by hand: the ranks' torch threads say PyTorch
    hand = {"steps_marked_by": [facts.STEP_MARKERS["explicit"]],
            "ranks": [{"rank": 0, "cpu": {"torch_threads": 4}}]}
    assert R.framework(hand) == "pytorch"
    assert R.framework({"steps_marked_by": [facts.STEP_MARKERS["explicit"]],
                        "ranks": [{"rank": 0, "cpu": {"torch_threads": None}}]}) == "unknown"
    assert R.framework({}) == R.framework(None) == "unknown"


PHRASES = [R.threads_remedy, R.profile_compute_remedy, R.even_data_remedy,
           R.mark_steps_remedy, R.sync_name, R.completion_detail]


@pytest.mark.parametrize("phrase", PHRASES, ids=lambda f: f.__name__)
def test_each_phrase_speaks_one_framework(phrase: object) -> None:
    assert callable(phrase)
    tf_text, torch_text = phrase("tensorflow"), phrase("pytorch")
    assert tf_text and torch_text and tf_text != torch_text
    assert not TORCH_WORDS.search(tf_text), tf_text
    assert not TF_WORDS.search(torch_text), torch_text
    with pytest.raises(ValueError, match="framework must be one of"):
        phrase("jax")


def test_the_threads_remedy_names_each_api() -> None:
    tf_text = R.threads_remedy("tensorflow")
    assert "tf.config.threading.set_intra_op_parallelism_threads" in tf_text
    assert "set_inter_op_parallelism_threads" in tf_text
    assert R.threads_remedy("pytorch") == "torch.set_num_threads, OMP_NUM_THREADS"
    both = R.threads_remedy("unknown")  # neither known: both, PyTorch's first
    assert both.index("torch.set_num_threads") < both.index("tf.config.threading")
    assert R.threads_detail("tensorflow", 3) == "TensorFlow uses 3 intra-op threads"
    assert R.threads_detail("pytorch", 3) == "torch uses 3 intra-op threads"
    assert R.threads_detail("pytorch", 0) == ""
    for phrase in (R.profile_compute_remedy, R.even_data_remedy, R.mark_steps_remedy):
        text = phrase("unknown")
        assert TORCH_WORDS.search(text) or "hvd.DistributedOptimizer" in text, text
        assert TF_WORDS.search(text), text
