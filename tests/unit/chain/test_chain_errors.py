"""Revert decoding: one Python class per Solidity custom error, carrying its arguments."""

from __future__ import annotations

import pytest
from eth_abi import encode
from eth_tester.exceptions import TransactionFailed
from web3.exceptions import ContractCustomError

from krill.chain import errors as E
from krill.chain.artifacts import load_artifact
from krill.errors import ChainError, ContractRevert

ABI_ERRORS = [e for name in ("KrillProtocol", "KrillToken") for e in load_artifact(name).errors()]


@pytest.mark.parametrize("entry", ABI_ERRORS, ids=lambda e: e["name"])
def test_every_abi_error_has_its_class(entry):
    cls = getattr(E, entry["name"])
    assert issubclass(cls, ContractRevert) and issubclass(cls, ChainError)
    assert cls.__name__ == cls.error_name == entry["name"]
    assert len(cls.arg_types) == len(entry["inputs"])


def test_decode_round_trip_with_arguments():
    worker = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
    run_id = bytes(range(32))
    cls = E.CommitDuplicate
    data = cls.selector + encode(list(cls.arg_types), [run_id, worker, 3, 7, 11])
    err = E.decode_revert(data, "commit")
    assert type(err) is E.CommitDuplicate
    assert err.revert_args == (run_id, worker, 3, 7, 11)
    assert err.named_args == {"run_id": run_id, "worker": worker, "version": 3, "nonce": 7, "existing_commit_id": 11}
    assert str(err).startswith("commit: reverted with CommitDuplicate(run_id=0x0001")


def test_string_panic_and_unknown_reverts():
    reason = E.decode_revert(bytes.fromhex("08c379a0") + encode(["string"], ["nope"]))
    assert type(reason) is E.ContractRevertReason and reason.revert_args == ("nope",)
    panic = E.decode_revert(bytes.fromhex("4e487b71") + encode(["uint256"], [0x11]))
    assert type(panic) is E.ContractPanic and panic.revert_args == (0x11,)
    unknown = E.decode_revert(b"\xde\xad\xbe\xef\x01")
    assert type(unknown) is E.UnknownContractRevert and unknown.data == b"\xde\xad\xbe\xef\x01"
    truncated = E.decode_revert(E.CommitDuplicate.selector + b"\x00" * 5)
    assert type(truncated) is E.UnknownContractRevert


def test_revert_data_from_eth_tester_and_web3_exceptions():
    data = E.ClaimNothing.selector + encode(["address"], ["0x" + "11" * 20])
    # eth-tester through web3: the raw bytes end up as the repr inside the message.
    try:
        try:
            raise TransactionFailed(Exception(data))
        except TransactionFailed as inner:
            raise TransactionFailed(f"execution reverted: {inner.args[0]}") from None
    except TransactionFailed as exc:
        assert E.revert_data_from_exception(exc) == data
        assert type(E.revert_from_exception(exc)) is E.ClaimNothing
    web3_exc = ContractCustomError("0x" + data.hex(), data="0x" + data.hex())
    assert E.revert_data_from_exception(web3_exc) == data
    assert E.revert_from_exception(ValueError("not a revert")) is None


def test_snake_case():
    assert E.snake_case("ed25519PublicKey") == "ed25519_public_key"
    assert E.snake_case("existingCommitId") == "existing_commit_id"
    assert E.snake_case("token_") == "token"


def test_raw_eth_call_errors_become_reverts_or_chain_errors():
    from krill.chain.tx import call_error

    cls = E.CommitUnknown
    data = "0x" + (cls.selector + encode(list(cls.arg_types), [9])).hex()
    anvil = call_error({"code": 3, "message": "execution reverted: custom error", "data": data}, "commitOf")
    assert type(anvil) is E.CommitUnknown and anvil.revert_args == (9,) and str(anvil).startswith("commitOf: ")
    nested = call_error({"code": -32000, "message": "execution reverted", "data": {"data": data}}, "commitOf")
    assert type(nested) is E.CommitUnknown
    reason = call_error({"code": 3, "message": "execution reverted: not allowed"}, "runOf")
    assert type(reason) is E.ContractRevertReason and reason.revert_args == ("not allowed",)
    other = call_error({"code": -32602, "message": "invalid argument 0"}, "runOf")
    assert type(other) is ChainError and not isinstance(other, ContractRevert)
    assert "runOf" in str(other) and "invalid argument 0" in str(other)


def test_reverts_in_nethermind_and_besu_words_are_reverts():
    """Nethermind and OpenEthereum answer a revert with "VM execution error." and data "Reverted 0x<data>";
    Besu says "Execution reverted". Each is the revert it stands for, through the bare JSON-RPC path (views,
    estimates) and through web3's ContractLogicError (which keeps the prefixed data)."""
    from web3.exceptions import ContractLogicError

    from krill.chain.tx import call_error

    cls = E.CommitDuplicate
    worker = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
    data = cls.selector + encode(list(cls.arg_types), [bytes(range(32)), worker, 3, 7, 11])
    nethermind = {"code": -32015, "message": "VM execution error.", "data": "Reverted 0x" + data.hex()}
    bare = call_error(nethermind, "commit", "eth_estimateGas")
    assert type(bare) is E.CommitDuplicate and bare.revert_args == (bytes(range(32)), worker, 3, 7, 11)
    through_web3 = E.revert_from_exception(ContractLogicError("execution reverted", data=nethermind["data"]))
    assert type(through_web3) is E.CommitDuplicate
    empty = call_error({"code": -32015, "message": "VM execution error.", "data": "Reverted 0x"}, "claim")
    assert type(empty) is E.UnknownContractRevert and empty.data == b""
    besu = call_error({"code": -32000, "message": "Execution reverted"}, "claim", "eth_estimateGas")
    assert type(besu) is E.ContractRevertReason
