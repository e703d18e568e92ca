"""RuntimeLoras: the calls that bring a restarted engine to the adapters wanted (its --lora ones
it holds at start, minus those unloaded since, plus those loaded at run time), and forgetting
one a new engine could not load again."""

from __future__ import annotations

from radixserve.cluster.runtime_loras import RuntimeLoras

START = {"a": "/lora/a", "b": "/lora/b"}  # what every engine of this server loads at start


def test_the_first_engine_sets_what_is_wanted():
    loras = RuntimeLoras()
    assert loras.calls_for(START) == []
    assert loras.wanted == START
    assert loras.calls_for(START) == []  # a second replica, or a restart with nothing changed


def test_a_restarted_engine_is_brought_to_what_was_loaded_and_unloaded():
    loras = RuntimeLoras()
    loras.calls_for(START)
    loras.loaded("c", "/lora/c")
    loras.unloaded("a")
    loras.unloaded("b")
    loras.loaded("b", "/lora/b2")  # a start name loaded again from elsewhere
    assert loras.calls_for(START) == [("a", None), ("b", None), ("c", "/lora/c"),
                                      ("b", "/lora/b2")]
    assert loras.calls_for({"c": "/lora/c", "b": "/lora/b2"}) == []


def test_forget_tells_each_callback_once():
    loras = RuntimeLoras()
    loras.calls_for(START)
    told = []
    loras.on_forgotten.append(told.append)
    loras.forget("a")
    loras.forget("a")  # a second replica that could not load it either
    loras.forget("never-loaded")
    assert told == ["a"] and loras.wanted == {"b": "/lora/b"}
    assert loras.calls_for(START) == [("a", None)]

