"""Name lists: a parameter value may hold a colon (issue 21, bug 15)."""

from marconi.core.registry import parse_name, split_name_list


def test_a_colon_in_a_parameter_value_stays_in_its_item() -> None:
    items = split_name_list("vllm-align:eviction=marconi,alpha_source=m:f,vanilla,marconi:alpha=1,multiplier=15")
    assert items == ["vllm-align:eviction=marconi,alpha_source=m:f", "vanilla", "marconi:alpha=1,multiplier=15"]
    assert parse_name(items[0]).params == {"eviction": "marconi", "alpha_source": "m:f"}


def test_items_without_parameters_and_with_them_still_split() -> None:
    assert split_name_list("vanilla, vllm+ ,sglang+:x=1,y=2,custom:admission=marconi") == [
        "vanilla", "vllm+", "sglang+:x=1,y=2", "custom:admission=marconi"]
