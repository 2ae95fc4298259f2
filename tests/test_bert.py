"""The BERT encoder stack (BertAttention, BertLayer, BertModel): the honest example tree passes every
CPU case of the layer and model tasks, and wrong candidates fail exactly on the cases that can see their bug.
(HF agreement of the model in float64: tests/test_hf_bert.py.)"""
import pytest

from conftest import EXAMPLES
from test_verdicts import assert_fails_exactly, assert_passes_every_case

pytest.importorskip("triton")


# the layer and the model run the example tree's attention block inside them
@pytest.mark.parametrize("task_name", ["bert_layer", "bert_model"])
def test_example_tree_passes_every_case(task_name):
    assert_passes_every_case(task_name, EXAMPLES)


@pytest.mark.parametrize("tree, task_name, failing", [
    # add & norm in the wrong order: a unit-scale residual on top of the norm, wrong everywhere
    ("bert_residual_after_norm", "bert_attention", lambda c: True),
    # one packed sequence instead of several: a single-sentence batch cannot see it
    ("bert_attends_across_sequences", "bert_attention", lambda c: len(c["lengths"]) > 1),
    # pre-norm instead of post-norm: the output is the un-normed residual stream
    ("bert_pre_norm", "bert_layer", lambda c: True),
], ids=["residual-after-norm", "attends-across-sequences", "pre-norm"])
def test_wrong_candidates_fail_exactly_where_expected(tree, task_name, failing):
    assert_fails_exactly(task_name, tree, failing, some_pass=tree == "bert_attends_across_sequences")
