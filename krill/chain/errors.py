"""Contract reverts as Python exceptions: one class per Solidity custom error.

Design decisions:
- The classes are generated at import from the committed ABIs (KrillProtocol, KrillToken and
  the OpenZeppelin errors they inherit), so they can never drift from the contracts. Each class
  is named exactly like its Solidity error, subclasses `krill.errors.ContractRevert`, and carries
  the decoded arguments in `.revert_args` (tuple, ABI order) and `.named_args` (dict, snake_case).
- `Error(string)` becomes `ContractRevertReason`, `Panic(uint256)` becomes `ContractPanic`, and
  revert data no ABI explains becomes `UnknownContractRevert` with the raw bytes: nothing is lost.
- Revert data is recovered from whatever the backend raised: web3's `ContractLogicError.data`
  (HTTP nodes such as Anvil) or the raw bytes inside eth-tester's `TransactionFailed` (py-evm).
  Nodes word it differently: geth and Anvil put the bare hex in `data`; Nethermind and OpenEthereum
  answer "VM execution error." with `data` "Reverted 0x<data>" (as web3's own parser knows), which
  was read as no revert at all, so every revert on such a node was a plain ChainError and no caller
  could tell a stale or duplicate commit from a refusal; Besu says "Execution reverted", capitalised.
"""

from __future__ import annotations

import ast
import re

from eth_abi import decode as abi_decode
from eth_utils import function_signature_to_4byte_selector, to_checksum_address

from krill.chain.artifacts import CONTRACT_NAMES, TEST_CONTRACT_NAMES, load_artifact
from krill.errors import ChainError, ContractRevert


class ChainInputError(ChainError, ValueError):
    """A value passed to the chain client is malformed (wrong length, negative, ...)."""


class ContractRevertReason(ContractRevert):
    """A revert with a plain `Error(string)` reason."""

    error_name = "Error"


class ContractPanic(ContractRevert):
    """A Solidity panic (`Panic(uint256)`): an assertion, overflow or similar bug."""

    error_name = "Panic"


class UnknownContractRevert(ContractRevert):
    """A revert whose data matches no known error; `.data` holds the raw bytes."""

    error_name = "Unknown"

    def __init__(self, message: str, data: bytes = b""):
        super().__init__(message, (data,))
        self.data = data


def snake_case(name: str) -> str:
    """`ed25519PublicKey` -> `ed25519_public_key`; a trailing `_` is dropped (`token_`)."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", name).lower().strip("_")


def _abi_type(entry: dict) -> str:
    kind = entry["type"]
    if kind.startswith("tuple"):
        return "(" + ",".join(_abi_type(c) for c in entry["components"]) + ")" + kind[5:]
    return kind


def _display(value: object) -> str:
    if isinstance(value, bytes):
        return "0x" + value.hex()
    return repr(value) if isinstance(value, str) else str(value)


def _make_class(entry: dict) -> type[ContractRevert]:
    name = entry["name"]
    types = tuple(_abi_type(i) for i in entry["inputs"])
    names = tuple(snake_case(i["name"]) or f"arg{n}" for n, i in enumerate(entry["inputs"]))
    selector = function_signature_to_4byte_selector(f"{name}({','.join(types)})")

    def named_args(self) -> dict:
        return dict(zip(self.arg_names, self.revert_args, strict=True))

    doc = f"Solidity custom error `{name}({', '.join(f'{t} {n}' for t, n in zip(types, names, strict=True))})`."
    return type(name, (ContractRevert,), {
        "__doc__": doc, "__module__": __name__, "error_name": name, "selector": selector,
        "arg_types": types, "arg_names": names, "named_args": property(named_args),
    })


def _build_registry() -> dict[bytes, type[ContractRevert]]:
    registry: dict[bytes, type[ContractRevert]] = {}
    for contract in CONTRACT_NAMES + TEST_CONTRACT_NAMES:
        for entry in load_artifact(contract).errors():
            cls = _make_class(entry)
            registry.setdefault(cls.selector, cls)
    return registry


ERRORS_BY_SELECTOR: dict[bytes, type[ContractRevert]] = _build_registry()
REVERT_CLASSES: dict[str, type[ContractRevert]] = {c.error_name: c for c in ERRORS_BY_SELECTOR.values()}
globals().update(REVERT_CLASSES)
__all__ = sorted(REVERT_CLASSES) + ["ChainInputError", "ContractPanic", "ContractRevertReason",
                                    "UnknownContractRevert", "decode_revert", "revert_data_from_exception",
                                    "revert_from_exception", "revert_from_rpc_error", "snake_case"]

_ERROR_STRING = function_signature_to_4byte_selector("Error(string)")
_PANIC = function_signature_to_4byte_selector("Panic(uint256)")


def _normalise(value: object, abi_type: str) -> object:
    if abi_type == "address":
        return to_checksum_address(value)
    return value


def decode_revert(data: bytes, context: str = "") -> ContractRevert:
    """The exception for revert `data` (never raises on bad data: unknown data is kept raw)."""
    where = f"{context}: " if context else ""
    selector, body = data[:4], data[4:]
    cls = ERRORS_BY_SELECTOR.get(selector)
    try:
        if cls is not None:
            values = tuple(_normalise(v, t) for v, t in zip(abi_decode(list(cls.arg_types), body), cls.arg_types,
                                                               strict=True))
            shown = ", ".join(f"{n}={_display(v)}" for n, v in zip(cls.arg_names, values, strict=True))
            return cls(f"{where}reverted with {cls.error_name}({shown})", values)
        if selector == _ERROR_STRING:
            (reason,) = abi_decode(["string"], body)
            return ContractRevertReason(f"{where}reverted: {reason}", (reason,))
        if selector == _PANIC:
            (code,) = abi_decode(["uint256"], body)
            return ContractPanic(f"{where}panicked with code {code:#x}", (code,))
    except Exception:  # noqa: BLE001 - malformed revert data is reported raw below, never lost
        pass
    return UnknownContractRevert(f"{where}reverted with unrecognised data 0x{data.hex()}", data)


def _bytes_from(value: object) -> bytes | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        text = value.removeprefix("execution reverted: ").removeprefix("Reverted ").strip()
        if text.startswith("0x"):
            try:
                return bytes.fromhex(text[2:])
            except ValueError:
                return None
        if text[:2] in ("b'", 'b"'):
            try:
                parsed = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                return None
            return parsed if isinstance(parsed, bytes) else None
    return None


def revert_data_from_exception(exc: BaseException) -> bytes | None:
    """The raw revert data inside an exception raised by web3 or eth-tester, or None if it was no revert."""
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        data = getattr(current, "data", None)
        if isinstance(data, str | bytes) and (found := _bytes_from(data)) is not None:
            return found
        if type(current).__name__ in ("TransactionFailed", "EVMRevert", "Revert", "ContractLogicError",
                                      "ContractCustomError", "ContractPanicError"):
            for arg in current.args:
                if isinstance(arg, BaseException):
                    stack.append(arg)
                elif (found := _bytes_from(arg)) is not None:
                    return found
        for linked in (current.__cause__, current.__context__):
            if linked is not None:
                stack.append(linked)
    return None


def revert_from_exception(exc: BaseException, context: str = "") -> ContractRevert | None:
    """The ContractRevert an exception from web3/eth-tester stands for, or None if it is no revert."""
    data = revert_data_from_exception(exc)
    if data is not None:
        return decode_revert(data, context)
    names = {type(e).__name__ for e in (exc, exc.__context__, exc.__cause__) if e is not None}
    if names & {"TransactionFailed", "ContractLogicError"}:
        return _reason_revert(str(exc.args[0] if exc.args else exc).removeprefix("execution reverted: "), context)
    return None


def revert_from_rpc_error(error: object, context: str = "") -> ContractRevert | None:
    """The ContractRevert a JSON-RPC error object stands for (an answer to a bare `eth_call` or
    `eth_estimateGas`): its revert data (Anvil and geth put it in `data`, some nodes nest it as
    `{"data": {"data": "0x..."}}`), else a reason-only "execution reverted" message; None if it is no
    revert."""
    if not isinstance(error, dict):
        return None
    data = error.get("data")
    if isinstance(data, dict):
        data = data.get("data")
    raw = _bytes_from(data) if isinstance(data, str) else None
    if raw is not None:
        return decode_revert(raw, context)
    message = str(error.get("message", ""))
    if message.lower().startswith("execution reverted"):
        return _reason_revert(message[len("execution reverted"):].removeprefix(":").strip(), context)
    return None


def _reason_revert(reason: str, context: str) -> ContractRevertReason:
    where = f"{context}: " if context else ""
    return ContractRevertReason(f"{where}reverted: {reason}", (reason,))
