"""/infill's editor stops, as llama.cpp applies them (no model): ``n_indent`` cuts the text
before the first line indented less, once that line's indent is known; ``t_max_predict_ms``
ends the answer at a new line written after the time limit."""

from __future__ import annotations

import time

from radixserve.frontend.llamacpp.protocol import InfillRequest
from radixserve.frontend.llamacpp.serving import Infill, indent_cut


def test_indent_cut():
    assert indent_cut("x = 1\n    y", 4, 0) == (None, 11)  # indented enough
    assert indent_cut("x = 1\n  ", 4, 0) == (None, 5)  # the indent is not known yet
    assert indent_cut("x = 1\n  z", 4, 0) == (8, 5)  # cut before "z", keeping the spaces
    assert indent_cut("x = 1\n\n", 4, 0) == (6, 5)  # a blank line has indent 0
    assert indent_cut("  first line is never judged", 4, 0) == (None, 28)


def test_infill_add_applies_n_indent_across_pieces():
    infill = Infill(InfillRequest(n_indent=4), [1, 2], time.time())
    assert infill.add("return a\n    ", [5, 6]) == ("return a\n    ", False)
    assert infill.add("+ b\n", [7]) == ("+ b\n", False)
    assert infill.add("print(1)", [8]) == ("", True)
    assert infill.content == "return a\n    + b\n" and infill.stop_type == "limit"


def test_infill_add_stops_at_a_new_line_after_t_max_predict_ms():
    infill = Infill(InfillRequest(t_max_predict_ms=1), [1], time.time())
    assert infill.add("a", [5]) == ("a", False)
    time.sleep(0.01)
    assert infill.add("b", [6]) == ("b", False)  # no new line yet
    assert infill.add("c\nd", [7]) == ("c\nd", True)
    assert infill.stop_type == "limit"
