"""The stack's one size rule, p2p_compress.internal.parse_size (advise and p2p-bench use it)."""

from __future__ import annotations

import pytest

from p2p_compress.internal import SIZE_RULE, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4096", 4096),
        ("12B", 12),
        ("1K", 1024),
        ("64k", 65536),
        ("64 KiB", 65536),
        ("1M", 1 << 20),
        ("1MiB", 1 << 20),
        ("1mib", 1 << 20),
        ("1MB", 1_000_000),
        ("1mb", 1_000_000),
        ("2kB", 2000),
        ("1.5MiB", 3 << 19),
        ("1.5k", 1536),
        ("0.5KB", 500),
        ("2G", 2 << 30),
        ("1GB", 10**9),
        ("1T", 1 << 40),
        ("1TB", 10**12),
        (" 8 M ", 8 << 20),
    ],
)
def test_binary_letters_and_decimal_b_suffixes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1X", "K", "1.2.3M", "-1", "-1K", "1e6", "0x10"])
def test_garbage_is_refused_naming_the_text_and_the_rule(text: str) -> None:
    with pytest.raises(ValueError, match="allowed") as info:
        parse_size(text, name="--size")
    msg = str(info.value)
    assert msg.startswith(f"--size: got {text!r}; allowed: ")
    assert SIZE_RULE in msg


@pytest.mark.parametrize("text", ["0", "0K", "0.0MiB"])
def test_zero_is_refused_by_default(text: str) -> None:
    with pytest.raises(ValueError, match=r"= 0 bytes; allowed: at least 1 byte$"):
        parse_size(text)
    assert parse_size(text, minimum=0) == 0


def test_fractions_must_come_to_whole_bytes() -> None:
    with pytest.raises(ValueError, match=r"got '1.5' = 1.5 bytes; allowed: whole bytes"):
        parse_size("1.5")
    with pytest.raises(ValueError, match="whole bytes"):
        parse_size("0.1KiB")
    assert parse_size("0.25KiB") == 256


def test_maximum_is_named_in_its_unit() -> None:
    assert parse_size("4GiB", maximum=4 << 30) == 4 << 30
    with pytest.raises(ValueError, match=r"got '5G' = 5368709120 bytes; allowed: at most 4 GiB"):
        parse_size("5G", maximum=4 << 30)


def test_non_str_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="size: got int 1024"):
        parse_size(1024)  # type: ignore[arg-type]
