"""A session's options are declared once (colibri._core.SESSION_OPTIONS): Session, Model.session,
memory_plan, expert_slots and expert_slot_count take them with the call forms and defaults they
always had, and refuse what they do not take as Python refuses an unknown argument."""
import numpy as np
import pytest

import colibri
from colibri._core import SESSION_OPTIONS, STREAMING_OPTIONS
from colibri.demo import MODEL_DIR

PROMPT = [1, 60, 61, 62, 63]


@pytest.fixture(scope="module")
def model():
    return colibri.Model(MODEL_DIR)


def test_positional_and_keyword_forms_make_the_same_session(model):
    by_position = colibri.Session(model, 16, 4, "reference", "hash")
    by_name = model.session(ctx=16, batch=4, kernels="reference", routing="hash")
    through_model = model.session(16, 4, "reference", routing="hash")
    assert (by_position.n_ctx, by_position.kernels) == (16, "reference")
    logits = [s.forward(PROMPT) for s in (by_position, by_name, through_model)]
    assert all(np.array_equal(logits[0], x) for x in logits[1:])
    # the hash router changes the output: the option reached the core
    assert not np.array_equal(logits[0], model.session(ctx=16, kernels="reference").forward(PROMPT))


def test_the_plan_is_the_arena_a_session_with_those_options_uses(model):
    least, least_per_layer = model.expert_slots()[1], model.expert_slots(expert_cache="per_layer")[1]
    for options in ({}, {"expert_budget": least}, {"expert_budget": least_per_layer, "expert_cache": "per_layer"}):
        plan = model.memory_plan(32, 8, **options)
        assert plan == model.session(ctx=32, batch=8, **options).memory()["arena_used"]   # exact, made before


@pytest.mark.parametrize("call, refused", [
    (lambda m: m.memory_plan(16, devices=()), "devices"),
    (lambda m: m.expert_slots(ctx=16), "ctx"),
    (lambda m: m.expert_slot_count(routing="hash"), "routing"),
    (lambda m: m.session(ctx=16, budget=1), "budget"),
    (lambda m: colibri.Session(m, 16, ctx=16), "ctx"),
])
def test_an_option_a_call_does_not_take_is_refused(model, call, refused):
    with pytest.raises(TypeError, match=refused):
        call(model)


def test_too_many_positional_arguments_are_refused(model):
    with pytest.raises(TypeError, match="at most 3 positional"):
        model.session(16, 0, "auto", "model")
    with pytest.raises(TypeError, match="at most 2 positional"):
        model.memory_plan(16, 0, 0)


def test_the_table_holds_every_streaming_option():
    assert set(STREAMING_OPTIONS) <= set(SESSION_OPTIONS)
