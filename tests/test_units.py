"""Sizes as people type them: the limit the messages name (1 EB) can be written, and large sizes
print in their own unit. Old: '1EB' was unreadable though the 1 EB limit was named in the message
a '1e19' got, and 1e18 bytes printed as '1e+06TB'."""

import pytest

from marconi.core.registry import ConfigError
from marconi.units import format_bytes, parse_bytes


def test_exabytes_read_up_to_the_limit_and_print_in_their_unit():
    assert parse_bytes("1EB") == 10**18 and parse_bytes("0.5eb") == 5 * 10**17
    assert parse_bytes("2PiB") == 2 * 2**50
    assert format_bytes(10**18) == "1EB" and format_bytes(2.5e15) == "2.5PB" and format_bytes(3e12) == "3TB"
    with pytest.raises(ConfigError, match=r"larger than 1e\+18 bytes \(1 EB\)"):
        parse_bytes("1EiB")
