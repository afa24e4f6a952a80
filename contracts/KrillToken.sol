// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {ERC20} from "@openzeppelin/contracts/token/ERC20/ERC20.sol";
import {ERC20Burnable} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Burnable.sol";
import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";

/// @title KrillToken
/// @notice The ERC-20 token Krill participants stake and are rewarded in.
/// @dev Accounts holding MINTER_ROLE may mint; on devnets the deployer holds it and funds
///      participants. On a real deployment the minter role would be renounced after the
///      initial distribution. Burning (ERC20Burnable) is how KrillProtocol destroys the
///      non-bounty part of a slash, so total supply falls by exactly what was burned.
contract KrillToken is ERC20, ERC20Burnable, AccessControl {
    /// @notice Role allowed to mint new tokens.
    bytes32 public constant MINTER_ROLE = keccak256("MINTER_ROLE");

    /// @notice Deploy the token; `admin` receives the admin and minter roles.
    /// @param admin Account that administers roles and may mint.
    constructor(address admin) ERC20("Krill", "KRILL") {
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(MINTER_ROLE, admin);
    }

    /// @notice Mint `amount` tokens to `to`. Only MINTER_ROLE.
    /// @param to Recipient of the new tokens.
    /// @param amount Amount to mint (18 decimals).
    function mint(address to, uint256 amount) external onlyRole(MINTER_ROLE) {
        _mint(to, amount);
    }
}
