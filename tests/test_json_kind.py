"""``json_kind`` and ``described``: the one wording a message uses for a decoded JSON value's type."""

from __future__ import annotations

import json
from collections import OrderedDict

import numpy as np
import pytest

from marconi.core.jsonfile import described, json_kind


@pytest.mark.parametrize("text, kind", [
    ("null", "null"), ("true", "a bool"), ("false", "a bool"), ("3", "an integer"), ("-0", "an integer"),
    ("2.5", "a number"), ("1e3", "a number"), ("NaN", "a number"), ('"x"', "a string"), ('""', "a string"),
    ("[]", "a list"), ("[1, 2]", "a list"), ("{}", "an object"), ('{"a": 1}', "an object"),
])
def test_every_decoded_json_value_has_its_kind(text, kind):
    assert json_kind(json.loads(text)) == kind


def test_a_bool_is_not_an_integer_and_a_subclass_reads_as_its_base():
    assert json_kind(True) == "a bool" and json_kind(1) == "an integer"
    assert json_kind(OrderedDict()) == "an object" and json_kind(np.float64(1.5)) == "a number"


def test_what_json_never_decodes_to_is_named_as_a_python_type():
    assert json_kind((1, 2)) == "a Python tuple"
    assert json_kind(np.zeros(2)) == "a Python numpy.ndarray"
    assert json_kind(np.int64(3)) == "a Python numpy.int64"


@pytest.mark.parametrize("value, text", [
    (None, "null"), ([1, 2], "a list"), ({"a": 1}, "an object"),  # no contents for a container
    (True, "a bool (True)"), (-3, "an integer (-3)"), (2.5, "a number (2.5)"), ("1,2", "a string ('1,2')"),
    ((1, 2), "a Python tuple ((1, 2))"),
])
def test_described_adds_the_value_to_a_scalars_kind(value, text):
    assert described(value) == text


def test_described_cuts_a_long_value():
    text = described("x" * 500)
    assert text.startswith("a string ('xxx") and text.endswith("...)") and len(text) < 100


def test_both_are_public():
    import marconi.core.jsonfile as jsonfile

    assert {"json_kind", "described"} <= set(jsonfile.__all__)
