"""Contract calls encoded (and views decoded) here with eth_abi, around one plain `eth_call` or transaction.

Design decisions:
- web3's `ContractFunction.call` re-derives the 4-byte selector of every function in the ABI to
  validate each call (about 50 keccaks for KrillProtocol) and walks its formatters over inputs and
  outputs: 2 of a view's 3 ms of CPU on Anvil, paid by every role for every read (the worker's
  version watcher alone reads 4 times a second); `build_transaction` pays the same for every
  transaction. Here each function's selector and types are derived once per ABI and arguments are
  encoded by eth_abi; a view goes through `w3.eth.call` (middleware, provider, our retries and
  revert decoding all unchanged) and its output is decoded by eth_abi; a transaction carries the
  same calldata.
- Results are what web3 returns: the same values, structs as tuples and arrays as lists, with
  addresses checksummed as web3's return normalizer does; a test compares the two paths view by
  view, for every view of both contracts.
- Arguments are what eth_abi accepts: an address may be written in lower case (web3 insists on
  checksum capitals); mixed case with a wrong checksum is refused by both.
- Views are the functions whose state mutability is `view` or `pure` (`view_codecs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from eth_abi import decode, encode
from eth_utils import (
    function_signature_to_4byte_selector,
    is_checksum_address,
    is_hex_address,
    to_checksum_address,
)

from krill.chain.errors import ChainInputError


def _type_string(param: dict) -> str:
    """The canonical ABI type of a parameter, tuples spelled out: "(address,uint64)[]"."""
    kind = param["type"]
    if kind.startswith("tuple"):
        inner = ",".join(_type_string(c) for c in param["components"])
        return f"({inner}){kind[len('tuple'):]}"
    return kind


def _normalizer(param: dict):
    """A function making eth_abi's decoded value of `param` equal to web3's (checksummed addresses)."""
    kind = param["type"]
    if kind.endswith("]"):  # web3 gives arrays as lists, eth_abi as tuples
        element = _normalizer({**param, "type": kind[:kind.rindex("[")]})
        return (lambda v: list(v)) if element is None else (lambda v: [element(x) for x in v])
    if kind == "address":
        return to_checksum_address
    if kind == "tuple":
        parts = [_normalizer(c) for c in param["components"]]
        if all(p is None for p in parts):
            return None
        return lambda v: tuple(x if p is None else p(x) for p, x in zip(parts, v, strict=True))
    return None


def _check_address(what: str, value) -> None:
    """A 0x-prefixed 20-byte hex address, all lower case, all upper case or with a valid checksum."""
    if not (isinstance(value, str) and is_hex_address(value)):
        raise ChainInputError(f"{what}: {value!r} is not a 0x-prefixed 20-byte hex address")
    digits = value[2:]
    if digits != digits.lower() and digits != digits.upper() and not is_checksum_address(value):
        raise ChainInputError(f"{what}: address {value} has a wrong checksum (mixed case that is not EIP-55)")


@dataclass(frozen=True)
class ViewCodec:
    """Selector, argument types and output decoding of one contract function."""

    name: str
    selector: bytes
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    normalizers: tuple
    is_view: bool

    def calldata(self, args: tuple) -> str:
        if len(args) != len(self.inputs):
            raise ChainInputError(f"{self.name}: expected {len(self.inputs)} arguments, got {len(args)}")
        for kind, value in zip(self.inputs, args, strict=True):
            if kind == "address":
                _check_address(self.name, value)
        return "0x" + (self.selector + encode(list(self.inputs), list(args))).hex()

    def result(self, raw: bytes) -> Any:
        values = decode(list(self.outputs), bytes(raw))
        values = tuple(v if n is None else n(v) for n, v in zip(self.normalizers, values, strict=True))
        return values[0] if len(values) == 1 else list(values)


@cache
def function_codecs(artifact: str) -> dict[str, ViewCodec]:
    """The codecs of every function of contract artifact `artifact`, by name (the ABI has no overloads)."""
    from krill.chain.artifacts import load_artifact

    out = {}
    for entry in load_artifact(artifact).abi:
        if entry.get("type") != "function":
            continue
        inputs = tuple(_type_string(p) for p in entry["inputs"])
        outputs = tuple(_type_string(p) for p in entry.get("outputs", []))
        selector = function_signature_to_4byte_selector(f"{entry['name']}({','.join(inputs)})")
        if entry["name"] in out:
            raise ChainInputError(f"{artifact}: function {entry['name']} is overloaded; codecs are by name")
        out[entry["name"]] = ViewCodec(entry["name"], selector, inputs, outputs,
                                       tuple(_normalizer(p) for p in entry.get("outputs", [])),
                                       entry.get("stateMutability") in ("view", "pure"))
    return out


def view_codecs(artifact: str) -> dict[str, ViewCodec]:
    """The codecs of the view and pure functions of `artifact`, by name."""
    return {name: codec for name, codec in function_codecs(artifact).items() if codec.is_view}
