// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {ITokenReceivedHook} from "./ReentrantToken.sol";

/// @notice The parts of KrillProtocol the attacker calls.
interface IKrillProtocolTarget {
    function stake(uint8 role, uint256 amount, bytes32 ed25519PublicKey) external;
    function requestUnstake(uint256 amount) external;
    function withdraw() external;
    function claim() external;
}

/// @notice The ReentrantToken call that registers the hook.
interface IHookRegistry {
    function setHooked(bool on) external;
}

/// @title ReentrantReceiver (test only)
/// @notice A malicious participant: when the protocol pays it (claim or withdraw), the token's
///         hook lets it call the same function again before the first call finished. With
///         `swallow` set it catches the failure of the re-entry and records its revert data, so
///         the test can check both that the re-entry failed and that the outer payout was single.
contract ReentrantReceiver is ITokenReceivedHook {
    /// @notice Re-entry attempted from inside the hook: 0 none, 1 claim, 2 withdraw.
    uint8 public reenterWith;
    /// @notice Whether the re-entry's failure is caught (true) or bubbles up (false).
    bool public swallow;
    /// @notice Number of times the hook ran.
    uint256 public hookCalls;
    /// @notice Revert data of the last caught re-entry.
    bytes public lastRevertData;

    IKrillProtocolTarget private immutable _protocol;
    IERC20 private immutable _token;

    /// @notice Emitted when a re-entry attempt failed and was caught.
    event ReentryBlocked(bytes revertData);

    constructor(IKrillProtocolTarget protocol_, IERC20 token_) {
        _protocol = protocol_;
        _token = token_;
        IHookRegistry(address(token_)).setHooked(true);
    }

    /// @notice Choose the re-entry to attempt and whether to catch its failure.
    function arm(uint8 reenterWith_, bool swallow_) external {
        reenterWith = reenterWith_;
        swallow = swallow_;
    }

    /// @notice Stake as a worker (tokens must already be held by this contract).
    function stakeAsWorker(uint256 amount, bytes32 key) external {
        _token.approve(address(_protocol), amount);
        _protocol.stake(1, amount, key);
    }

    /// @notice Request unstake of `amount`.
    function requestUnstake(uint256 amount) external {
        _protocol.requestUnstake(amount);
    }

    /// @notice Withdraw released stake (the hook re-enters if armed).
    function withdraw() external {
        _protocol.withdraw();
    }

    /// @notice Claim credits (the hook re-enters if armed).
    function claim() external {
        _protocol.claim();
    }

    /// @inheritdoc ITokenReceivedHook
    function onTokenReceived(address, uint256) external override {
        hookCalls += 1;
        uint8 mode = reenterWith;
        if (mode == 0 || msg.sender != address(_token)) return;
        reenterWith = 0;
        bytes memory data = mode == 1
            ? abi.encodeCall(IKrillProtocolTarget.claim, ())
            : abi.encodeCall(IKrillProtocolTarget.withdraw, ());
        (bool ok, bytes memory ret) = address(_protocol).call(data);
        if (ok) return;
        if (swallow) {
            lastRevertData = ret;
            emit ReentryBlocked(ret);
            return;
        }
        assembly {
            revert(add(ret, 32), mload(ret))
        }
    }
}
