"""check_depth: a linear scan with exactly the semantics of the regex it replaced."""

import random
import re

import pytest
from payload_samples import LIMITS

from krill.payload import decode_header
from krill.payload.canonical import check_depth, parse_canonical
from krill.payload.errors import MalformedPayloadError
from krill.payload.tensors import parse_safetensors

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def regex_check_depth(text: str, max_depth: int, field: str) -> None:
    """The former check_depth (quadratic on unterminated strings), kept as the reference."""
    depth = 0
    for bracket in _BRACKET.findall(_STRING.sub("", text)):
        depth += 1 if bracket in "[{" else -1
        if depth > max_depth:
            raise MalformedPayloadError(f"nesting deeper than {max_depth}", field=field)


def outcome(check, text: str, max_depth: int) -> str | None:
    try:
        check(text, max_depth, "f")
    except MalformedPayloadError as exc:
        return str(exc)
    return None


NESTINGS = [
    "", "[]", "[[]]", "[[[]]]", "{}", '{"a":{"b":[1]}}', '{"a":{"b":[[1]]}}', "]]]][[[", "[[]][[]]",
    '"[[[["', '["[[[["]', '"\\"[[["', '"\\\\"[[[', '"[[[', '"\\"[[[', '"\\\n[[[', '"[[[\\\n"', '"[[[\\',
    '"a"[[["', '""[[[', '"\\\\\\"[[["', '["\\u005b\\u005b\\u005b"]', '"\\[\\[\\["', '{"k":"}}}}"}[[[',
    '"x\n[[["', '"[[[\\\n""[[[', "[" * 17, "[" * 16 + "]" * 16, '"' + "[" * 17, "a\\[[[",
]


@pytest.mark.parametrize("text", NESTINGS)
def test_same_verdict_and_message_as_the_regex(text):
    for max_depth in (0, 1, 2, 3, 16):
        assert outcome(check_depth, text, max_depth) == outcome(regex_check_depth, text, max_depth), max_depth


def test_same_verdict_as_the_regex_on_random_text():
    rng = random.Random(0)
    for _ in range(20_000):
        text = "".join(rng.choice('"\\[]{}a\n') for _ in range(rng.randint(0, 20)))
        for max_depth in (0, 1, 2):
            assert outcome(check_depth, text, max_depth) == outcome(regex_check_depth, text, max_depth), text


@pytest.mark.timeout(30)  # the regex took ~14 s on 64 kB and ~1 hour on a 1 MiB safetensors header
def test_unterminated_string_of_escaped_quotes_is_linear():
    header = '"' + '\\"' * ((LIMITS.max_header_bytes - 1) // 2)
    check_depth(header, 16, "header")  # no brackets at all: nothing to refuse here
    with pytest.raises(MalformedPayloadError, match="not valid JSON"):
        parse_canonical(header.encode(), LIMITS.max_header_bytes, "header")
    with pytest.raises(MalformedPayloadError, match="header"):
        decode_header(header.encode(), LIMITS)
    # the string never closes, so its brackets count, as they always did
    with pytest.raises(MalformedPayloadError, match="nesting deeper than 16"):
        check_depth('"' + '\\"[' * 20_000, 16, "header")
    big = ('"' + '\\"' * ((LIMITS.max_safetensors_header_bytes - 1) // 2)).encode()
    framed = len(big).to_bytes(8, "little") + big
    with pytest.raises(MalformedPayloadError, match="not valid JSON"):
        parse_safetensors(framed, 2 << 20, LIMITS.max_safetensors_header_bytes, 8, "grad-0")
