// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Burnable} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Burnable.sol";

/// @notice Implemented by contracts that want to hear about incoming ReentrantToken transfers.
interface ITokenReceivedHook {
    /// @notice Called by ReentrantToken after `amount` was transferred to the implementer.
    function onTokenReceived(address from, uint256 amount) external;
}

/// @title ReentrantToken (test only)
/// @notice A burnable ERC-20 that calls the recipient back after every transfer to an account
///         that asked for it (ERC-777 style), so a malicious recipient can try to re-enter the
///         payer. Used only by the contract test suite to prove KrillProtocol's reentrancy guard.
contract ReentrantToken is ERC20, ERC20Burnable {
    /// @notice Accounts whose onTokenReceived hook is called on incoming transfers.
    mapping(address account => bool) public hooked;

    /// @notice The caller asks (or stops asking) to be called back on incoming transfers.
    function setHooked(bool on) external {
        hooked[msg.sender] = on;
    }

    /// @notice Create the token and mint `supply` to the deployer.
    constructor(uint256 supply) ERC20("Reentrant", "REENT") {
        _mint(msg.sender, supply);
    }

    /// @dev After each transfer to a hooked account (not mints or burns), call its hook.
    function _update(address from, address to, uint256 value) internal override {
        super._update(from, to, value);
        if (from != address(0) && to != address(0) && hooked[to]) {
            ITokenReceivedHook(to).onTokenReceived(from, value);
        }
    }
}
