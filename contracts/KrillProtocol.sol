// SPDX-License-Identifier: Apache-2.0
pragma solidity ^0.8.24;

import {AccessControl} from "@openzeppelin/contracts/access/AccessControl.sol";
import {ReentrancyGuard} from "@openzeppelin/contracts/utils/ReentrancyGuard.sol";
import {IERC20} from "@openzeppelin/contracts/token/ERC20/IERC20.sol";
import {SafeERC20} from "@openzeppelin/contracts/token/ERC20/utils/SafeERC20.sol";
import {ERC20Burnable} from "@openzeppelin/contracts/token/ERC20/extensions/ERC20Burnable.sol";

/// @title KrillProtocol
/// @notice Stake, commitments, verdicts, slashing, model versions and rewards of Krill runs.
/// @dev Design decisions (see DESIGN.md section 8):
///  - One account has one role (worker or verifier) and one Ed25519 key, both fixed by its first
///    stake and never changed, so signatures made under the key stay attributable forever.
///  - Stake leaves in two steps: requestUnstake moves it into unbonding, withdraw pays it out at the
///    release block. Unbonding stake can still be slashed. The release block is `unbondingBlocks`
///    after the later of the request and the close of the challenge window of the account's latest
///    commit (`windowEndOf`), and a commit made while stake is unbonding moves it later again
///    (`ReleaseDelayed`): the coordinator always has `unbondingBlocks` after a commit's window
///    closes to replay and slash it. (Counting from the request alone left it unbondingBlocks -
///    window blocks, none at all when the two were close: a worker could commit a forgery, request
///    its unstake in the next block and withdraw before the slash landed.) unbondingBlocks is also
///    kept strictly larger than every run's challenge window (checked in createRun and in the
///    setter). Each new request restarts the release block of the whole unbonding balance.
///  - Eligibility is "stake >= the role's minimum and not jailed", checked when acting; lowering
///    stake below the minimum is allowed and simply removes the right to act.
///  - Commit ids are sequential from 1. The check randomness of a commit is blockhash(commit block
///    + 1); sealRandomness records it on first use, so everybody agrees on it after the EVM forgets
///    the hash (256 blocks). Selection of a commit for checking by a verifier is a public function
///    of that randomness (isCheckSelected); attest does not require selection, quorum protects.
///  - Failing and passing attestations are capped separately, MAX_ATTESTATIONS each per commit. The
///    failing cap bounds the bounty loop in slash and is at least every run's quorum; the passing cap
///    only bounds a commit's verdicts (nothing loops over passes). One shared cap would let anyone
///    with MAX_ATTESTATIONS verifier accounts fill a commit with passes right after it lands, so no
///    failing verdict could ever reach quorum and the worker could never be slashed.
///  - A slash takes slashFractionBps of (staked + unbonding), staked first; verifierBountyBps of it
///    is shared by the verifiers who attested failure (at most MAX_ATTESTATIONS per commit, so the
///    loop is bounded) as pull-based credits; the rest, rounding dust included, is burned.
///  - Rewards come from a per-run pool funded by anyone; settle credits at most MAX_SETTLE_BATCH
///    accounts once per (run, version), capped by rewardPerVersion; claim pays all credits
///    (rewards and bounties) of the caller.
///  - Jailing is permanent for the account: a slashed worker stakes again under a new account.
///  - Tokens only move in functions guarded by nonReentrant, and only after all state changes.
contract KrillProtocol is AccessControl, ReentrancyGuard {
    using SafeERC20 for IERC20;

    // ----------------------------------------------------------------------------------------
    // Types and constants
    // ----------------------------------------------------------------------------------------

    /// @notice Role allowed to create runs.
    bytes32 public constant RUN_ADMIN_ROLE = keccak256("RUN_ADMIN_ROLE");
    /// @notice Participant role code of a worker.
    uint8 public constant ROLE_WORKER = 1;
    /// @notice Participant role code of a verifier.
    uint8 public constant ROLE_VERIFIER = 2;
    /// @notice Most failing attestations, and separately most passing attestations, a single commit
    ///         accepts (the failing cap bounds the loop in slash; passes never use up failing room).
    uint256 public constant MAX_ATTESTATIONS = 32;
    /// @notice Most accounts a single settle call credits.
    uint256 public constant MAX_SETTLE_BATCH = 64;
    /// @notice Denominator of basis-point fractions.
    uint256 public constant BPS = 10_000;
    /// @notice Denominator of the check probability (parts per million).
    uint256 public constant PPM = 1_000_000;

    /// @notice Parameters of a run, fixed at creation.
    /// @param coordinator Account that publishes versions, slashes and settles.
    /// @param maxStaleness Oldest accepted commit version is latest - maxStaleness.
    /// @param attestationQuorum Failing attestations needed before a slash.
    /// @param slashFractionBps Fraction of the worker's stake taken by a slash (basis points).
    /// @param verifierBountyBps Fraction of a slash paid to the failing verifiers (basis points).
    /// @param checkProbabilityPpm Probability that a verifier is selected to check a commit (ppm).
    /// @param challengeWindowBlocks Blocks after the commit block during which attestations count.
    /// @param rewardPerVersion Most tokens one version's settlement may credit.
    struct RunParams {
        address coordinator;
        uint32 maxStaleness;
        uint32 attestationQuorum;
        uint16 slashFractionBps;
        uint16 verifierBountyBps;
        uint32 checkProbabilityPpm;
        uint32 challengeWindowBlocks;
        uint256 rewardPerVersion;
    }

    /// @notice Stake record of one account.
    struct StakeInfo {
        uint8 role;
        bool jailed;
        bytes32 ed25519PublicKey;
        uint256 staked;
        uint256 unbonding;
        uint256 releaseBlock;
    }

    /// @notice State of one run.
    struct RunInfo {
        bool exists;
        RunParams params;
        uint64 latestVersion;
        uint256 rewardPool;
        uint256 createdBlock;
    }

    /// @notice One published model version (version 0 is the run's base manifest).
    struct VersionInfo {
        bytes32 manifestDigest;
        bytes32 recordDigest;
        uint256 publishedBlock;
        bool settled;
    }

    /// @notice One worker commitment.
    /// @dev Field order packs worker+version and nonce+commitBlock+counts+slashed into one slot each.
    struct CommitInfo {
        bytes32 runId;
        address worker;
        uint64 version;
        bytes32 headerDigest;
        uint64 nonce;
        uint64 commitBlock;
        uint32 passCount;
        uint32 failCount;
        bool slashed;
        bytes32 randomness;
    }

    /// @notice One verifier's verdict on one commit.
    struct AttestationInfo {
        bool exists;
        bool ok;
        bytes32 evidenceDigest;
    }

    // ----------------------------------------------------------------------------------------
    // Storage
    // ----------------------------------------------------------------------------------------

    IERC20 private immutable _token;
    uint256 private _unbondingBlocks;
    uint256 private _maxChallengeWindow;
    mapping(uint8 role => uint256) private _minimumStake;
    mapping(address account => StakeInfo) private _stakes;
    mapping(bytes32 runId => RunInfo) private _runs;
    mapping(bytes32 runId => mapping(uint64 version => VersionInfo)) private _versions;
    uint256 private _commitCount;
    mapping(uint256 commitId => CommitInfo) private _commits;
    mapping(bytes32 key => uint256 commitId) private _commitByKey;
    mapping(bytes32 digest => uint256 commitId) private _commitByDigest;
    mapping(uint256 commitId => mapping(address verifier => AttestationInfo)) private _attestations;
    mapping(uint256 commitId => address[]) private _failingVerifiers;
    mapping(address account => uint256) private _claimable;
    mapping(address account => uint256) private _windowEnd;
    uint256 private _totalStaked;
    uint256 private _totalUnbonding;
    uint256 private _totalRewardPools;
    uint256 private _totalClaimable;
    uint256 private _totalBurned;

    // ----------------------------------------------------------------------------------------
    // Events
    // ----------------------------------------------------------------------------------------

    /// @notice The minimum stake of a role was set.
    event MinimumStakeSet(uint8 indexed role, uint256 amount);
    /// @notice The unbonding period was set.
    event UnbondingBlocksSet(uint256 blocks);
    /// @notice `account` staked `amount` more as `role`; `staked` is its new staked balance.
    event Staked(address indexed account, uint8 indexed role, uint256 amount, uint256 staked, bytes32 ed25519PublicKey);
    /// @notice `account` moved `amount` into unbonding; all of it is released at `releaseBlock` (unless a later
    ///         commit of the account moves that, `ReleaseDelayed`).
    event UnstakeRequested(address indexed account, uint256 amount, uint256 unbonding, uint256 releaseBlock);
    /// @notice A commit (`commitId`) of `account` while stake was unbonding moved its release to `releaseBlock`.
    event ReleaseDelayed(address indexed account, uint256 indexed commitId, uint256 releaseBlock);
    /// @notice `account` withdrew `amount` of released unbonding stake.
    event Withdrawn(address indexed account, uint256 amount);
    /// @notice A run was created.
    event RunCreated(bytes32 indexed runId, address indexed coordinator, bytes32 baseManifestDigest, RunParams params);
    /// @notice `funder` added `amount` to the reward pool of `runId`, which now holds `rewardPool`.
    event RewardsFunded(bytes32 indexed runId, address indexed funder, uint256 amount, uint256 rewardPool);
    /// @notice A worker committed to a contribution's header digest.
    event Committed(
        uint256 indexed commitId, bytes32 indexed runId, address indexed worker, uint64 version, uint64 nonce, bytes32 headerDigest
    );
    /// @notice The check randomness of a commit was recorded.
    event RandomnessSealed(uint256 indexed commitId, bytes32 randomness);
    /// @notice A verifier attested a commit; counts are the commit's totals after this verdict.
    event Attested(
        uint256 indexed commitId, address indexed verifier, bool ok, bytes32 evidenceDigest, uint32 passCount, uint32 failCount
    );
    /// @notice A worker was slashed for a commit; `bounty` went to verifiers and `burned` was destroyed.
    event Slashed(uint256 indexed commitId, address indexed worker, uint256 amount, uint256 bounty, uint256 burned);
    /// @notice A worker was jailed (can no longer commit) because of a slashed commit.
    event WorkerJailed(address indexed worker, uint256 indexed commitId);
    /// @notice A verifier was credited a share of a slash.
    event BountyCredited(address indexed verifier, uint256 indexed commitId, uint256 amount);
    /// @notice A run's coordinator published a model version.
    event VersionPublished(bytes32 indexed runId, uint64 indexed version, bytes32 manifestDigest, bytes32 recordDigest);
    /// @notice An account was credited a reward for a version.
    event RewardCredited(bytes32 indexed runId, uint64 indexed version, address indexed account, uint256 amount);
    /// @notice A version's rewards were settled: `accounts` credits totalling `total`.
    event VersionSettled(bytes32 indexed runId, uint64 indexed version, uint256 accounts, uint256 total);
    /// @notice An account claimed all its credits.
    event Claimed(address indexed account, uint256 amount);

    // ----------------------------------------------------------------------------------------
    // Errors
    // ----------------------------------------------------------------------------------------

    /// @notice A role code other than ROLE_WORKER or ROLE_VERIFIER was given.
    error StakeInvalidRole(uint8 role);
    /// @notice A zero amount was given where a positive one is required.
    error StakeZeroAmount();
    /// @notice A zero Ed25519 public key was given.
    error StakeZeroKey();
    /// @notice The account already staked under another role.
    error StakeRoleMismatch(address account, uint8 registered, uint8 requested);
    /// @notice The account already registered another Ed25519 key.
    error StakeKeyMismatch(address account, bytes32 registered, bytes32 given);
    /// @notice The staked balance after the call would be below the role's minimum.
    error StakeBelowMinimum(uint8 role, uint256 staked, uint256 minimum);
    /// @notice Unstake request larger than the staked balance.
    error StakeInsufficient(address account, uint256 staked, uint256 requested);
    /// @notice Nothing is unbonding for the account.
    error StakeNothingUnbonding(address account);
    /// @notice The unbonding stake is not released yet.
    error StakeStillUnbonding(address account, uint256 releaseBlock, uint256 currentBlock);
    /// @notice The account is not an eligible (staked, not jailed) participant in `role`.
    error StakeNotEligible(address account, uint8 role);
    /// @notice The account is jailed.
    error StakeJailed(address account);
    /// @notice unbondingBlocks must exceed the longest challenge window of any run.
    error ProtocolUnbondingTooShort(uint256 unbondingBlocks, uint256 maxChallengeWindow);
    /// @notice A run with this id already exists.
    error RunAlreadyExists(bytes32 runId);
    /// @notice No run with this id.
    error RunUnknown(bytes32 runId);
    /// @notice The run id is zero.
    error RunZeroId();
    /// @notice The coordinator address is zero.
    error RunZeroCoordinator();
    /// @notice A run parameter is out of its range; `param` names it.
    error RunParamOutOfRange(string param, uint256 value);
    /// @notice A digest that must be non-zero was zero.
    error RunZeroDigest();
    /// @notice The caller is not the run's coordinator.
    error RunNotCoordinator(bytes32 runId, address caller);
    /// @notice A zero funding amount.
    error RunZeroFunding();
    /// @notice The run's reward pool cannot cover a settlement.
    error RunRewardPoolInsufficient(bytes32 runId, uint256 rewardPool, uint256 required);
    /// @notice The commit targets a version not published yet.
    error CommitVersionFromFuture(uint64 version, uint64 latestVersion);
    /// @notice The commit targets a version older than latest - maxStaleness.
    error CommitVersionTooStale(uint64 version, uint64 latestVersion, uint32 maxStaleness);
    /// @notice The worker already committed for this (run, version, nonce).
    error CommitDuplicate(bytes32 runId, address worker, uint64 version, uint64 nonce, uint256 existingCommitId);
    /// @notice The digest was already committed (by anyone).
    error CommitDigestTaken(bytes32 headerDigest, uint256 existingCommitId);
    /// @notice The header digest is zero.
    error CommitZeroDigest();
    /// @notice No commit with this id.
    error CommitUnknown(uint256 commitId);
    /// @notice The randomness block of the commit does not exist yet.
    error RandomnessNotYetAvailable(uint256 commitId, uint256 randomnessBlock, uint256 currentBlock);
    /// @notice The randomness block is more than 256 blocks old and was never sealed.
    error RandomnessExpired(uint256 commitId, uint256 randomnessBlock);
    /// @notice The commit's randomness was not sealed yet.
    error RandomnessNotSealed(uint256 commitId);
    /// @notice The verifier already attested this commit.
    error AttestationDuplicate(uint256 commitId, address verifier);
    /// @notice The challenge window of the commit has closed.
    error AttestationWindowClosed(uint256 commitId, uint256 lastBlock, uint256 currentBlock);
    /// @notice The commit already has MAX_ATTESTATIONS attestations with verdict `ok` (passes and
    ///         failures are counted apart).
    error AttestationLimitReached(uint256 commitId, bool ok, uint256 limit);
    /// @notice Not enough failing attestations to slash.
    error SlashQuorumNotReached(uint256 commitId, uint32 failCount, uint32 quorum);
    /// @notice The commit was already slashed.
    error SlashAlreadyDone(uint256 commitId);
    /// @notice The version was not published (or is the base version 0, which carries no rewards).
    error VersionNotPublished(bytes32 runId, uint64 version, uint64 latestVersion);
    /// @notice The published version must be latest + 1.
    error VersionNotNext(bytes32 runId, uint64 version, uint64 expected);
    /// @notice The version was already settled.
    error SettleAlreadyDone(bytes32 runId, uint64 version);
    /// @notice accounts and amounts differ in length.
    error SettleLengthMismatch(uint256 accounts, uint256 amounts);
    /// @notice The batch is empty or larger than MAX_SETTLE_BATCH.
    error SettleBatchSize(uint256 size, uint256 maximum);
    /// @notice An account in the batch is the zero address.
    error SettleZeroAccount(uint256 index);
    /// @notice The batch credits more than the run's rewardPerVersion.
    error SettleExceedsRewardPerVersion(uint256 total, uint256 rewardPerVersion);
    /// @notice The caller has nothing to claim.
    error ClaimNothing(address account);

    // ----------------------------------------------------------------------------------------
    // Construction and administration
    // ----------------------------------------------------------------------------------------

    /// @notice Deploy the protocol over `token`.
    /// @param token_ The stake and reward token (burnable).
    /// @param admin Receives DEFAULT_ADMIN_ROLE and RUN_ADMIN_ROLE.
    /// @param minimumWorkerStake Minimum staked balance of an eligible worker.
    /// @param minimumVerifierStake Minimum staked balance of an eligible verifier.
    /// @param unbondingBlocks_ Blocks from an unstake request, or from the close of the account's latest commit's
    ///        challenge window if that is later, to the release (at least 1).
    constructor(
        IERC20 token_,
        address admin,
        uint256 minimumWorkerStake,
        uint256 minimumVerifierStake,
        uint256 unbondingBlocks_
    ) {
        if (unbondingBlocks_ == 0) revert ProtocolUnbondingTooShort(unbondingBlocks_, 0);
        _token = token_;
        _grantRole(DEFAULT_ADMIN_ROLE, admin);
        _grantRole(RUN_ADMIN_ROLE, admin);
        _minimumStake[ROLE_WORKER] = minimumWorkerStake;
        emit MinimumStakeSet(ROLE_WORKER, minimumWorkerStake);
        _minimumStake[ROLE_VERIFIER] = minimumVerifierStake;
        emit MinimumStakeSet(ROLE_VERIFIER, minimumVerifierStake);
        _unbondingBlocks = unbondingBlocks_;
        emit UnbondingBlocksSet(unbondingBlocks_);
    }

    /// @notice Set the minimum stake of `role`. Only DEFAULT_ADMIN_ROLE.
    /// @param role ROLE_WORKER or ROLE_VERIFIER.
    /// @param amount New minimum staked balance.
    function setMinimumStake(uint8 role, uint256 amount) external onlyRole(DEFAULT_ADMIN_ROLE) {
        _requireValidRole(role);
        _minimumStake[role] = amount;
        emit MinimumStakeSet(role, amount);
    }

    /// @notice Set the unbonding period. Only DEFAULT_ADMIN_ROLE.
    /// @dev Must exceed every run's challenge window; applies to requests and commits made afterwards.
    /// @param blocks New unbonding period in blocks.
    function setUnbondingBlocks(uint256 blocks) external onlyRole(DEFAULT_ADMIN_ROLE) {
        if (blocks <= _maxChallengeWindow || blocks == 0) revert ProtocolUnbondingTooShort(blocks, _maxChallengeWindow);
        _unbondingBlocks = blocks;
        emit UnbondingBlocksSet(blocks);
    }

    // ----------------------------------------------------------------------------------------
    // Stake
    // ----------------------------------------------------------------------------------------

    /// @notice Stake `amount` tokens as `role` under `ed25519PublicKey` (first stake) or top up.
    /// @dev The caller must have approved `amount`. Role and key are fixed by the first stake.
    /// @param role ROLE_WORKER or ROLE_VERIFIER.
    /// @param amount Tokens to add to the staked balance.
    /// @param ed25519PublicKey The Ed25519 key that signs the caller's payloads.
    function stake(uint8 role, uint256 amount, bytes32 ed25519PublicKey) external nonReentrant {
        _requireValidRole(role);
        if (amount == 0) revert StakeZeroAmount();
        if (ed25519PublicKey == bytes32(0)) revert StakeZeroKey();
        StakeInfo storage s = _stakes[msg.sender];
        if (s.role == 0) {
            s.role = role;
            s.ed25519PublicKey = ed25519PublicKey;
        } else {
            if (s.role != role) revert StakeRoleMismatch(msg.sender, s.role, role);
            if (s.ed25519PublicKey != ed25519PublicKey) {
                revert StakeKeyMismatch(msg.sender, s.ed25519PublicKey, ed25519PublicKey);
            }
        }
        if (s.jailed) revert StakeJailed(msg.sender);
        uint256 newStaked = s.staked + amount;
        if (newStaked < _minimumStake[role]) revert StakeBelowMinimum(role, newStaked, _minimumStake[role]);
        s.staked = newStaked;
        _totalStaked += amount;
        emit Staked(msg.sender, role, amount, newStaked, ed25519PublicKey);
        _token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @notice Move `amount` of the caller's stake into unbonding.
    /// @dev Restarts the release block of the whole unbonding balance at unbondingBlocks after the later
    ///      of now and the close of the caller's latest commit's challenge window.
    /// @param amount Tokens to unbond.
    function requestUnstake(uint256 amount) external {
        if (amount == 0) revert StakeZeroAmount();
        StakeInfo storage s = _stakes[msg.sender];
        if (amount > s.staked) revert StakeInsufficient(msg.sender, s.staked, amount);
        s.staked -= amount;
        s.unbonding += amount;
        uint256 windowEnd = _windowEnd[msg.sender];
        s.releaseBlock = (block.number > windowEnd ? block.number : windowEnd) + _unbondingBlocks;
        _totalStaked -= amount;
        _totalUnbonding += amount;
        emit UnstakeRequested(msg.sender, amount, s.unbonding, s.releaseBlock);
    }

    /// @notice Pay out the caller's whole unbonding balance once its release block is reached.
    function withdraw() external nonReentrant {
        StakeInfo storage s = _stakes[msg.sender];
        uint256 amount = s.unbonding;
        if (amount == 0) revert StakeNothingUnbonding(msg.sender);
        if (block.number < s.releaseBlock) revert StakeStillUnbonding(msg.sender, s.releaseBlock, block.number);
        s.unbonding = 0;
        _totalUnbonding -= amount;
        emit Withdrawn(msg.sender, amount);
        _token.safeTransfer(msg.sender, amount);
    }

    // ----------------------------------------------------------------------------------------
    // Runs and versions
    // ----------------------------------------------------------------------------------------

    /// @notice Create run `runId` whose version 0 is `baseManifestDigest`. Only RUN_ADMIN_ROLE.
    /// @param runId Identifier of the run (non-zero, unique).
    /// @param baseManifestDigest sha256 of the base model manifest (version 0).
    /// @param params The run's parameters (see RunParams).
    function createRun(bytes32 runId, bytes32 baseManifestDigest, RunParams calldata params)
        external
        onlyRole(RUN_ADMIN_ROLE)
    {
        if (runId == bytes32(0)) revert RunZeroId();
        if (_runs[runId].exists) revert RunAlreadyExists(runId);
        if (baseManifestDigest == bytes32(0)) revert RunZeroDigest();
        if (params.coordinator == address(0)) revert RunZeroCoordinator();
        if (params.attestationQuorum == 0 || params.attestationQuorum > MAX_ATTESTATIONS) {
            revert RunParamOutOfRange("attestationQuorum", params.attestationQuorum);
        }
        if (params.slashFractionBps > BPS) revert RunParamOutOfRange("slashFractionBps", params.slashFractionBps);
        if (params.verifierBountyBps > BPS) revert RunParamOutOfRange("verifierBountyBps", params.verifierBountyBps);
        if (params.checkProbabilityPpm > PPM) {
            revert RunParamOutOfRange("checkProbabilityPpm", params.checkProbabilityPpm);
        }
        if (params.challengeWindowBlocks == 0 || params.challengeWindowBlocks >= _unbondingBlocks) {
            revert RunParamOutOfRange("challengeWindowBlocks", params.challengeWindowBlocks);
        }
        RunInfo storage r = _runs[runId];
        r.exists = true;
        r.params = params;
        r.createdBlock = block.number;
        if (params.challengeWindowBlocks > _maxChallengeWindow) _maxChallengeWindow = params.challengeWindowBlocks;
        _versions[runId][0] = VersionInfo(baseManifestDigest, bytes32(0), block.number, true);
        emit RunCreated(runId, params.coordinator, baseManifestDigest, params);
    }

    /// @notice Add `amount` tokens to the reward pool of `runId` (anyone; approval required).
    /// @param runId The run to fund.
    /// @param amount Tokens to add.
    function fundRewards(bytes32 runId, uint256 amount) external nonReentrant {
        RunInfo storage r = _existingRun(runId);
        if (amount == 0) revert RunZeroFunding();
        r.rewardPool += amount;
        _totalRewardPools += amount;
        emit RewardsFunded(runId, msg.sender, amount, r.rewardPool);
        _token.safeTransferFrom(msg.sender, address(this), amount);
    }

    /// @notice Publish `version` of `runId`. Only the run's coordinator; version = latest + 1.
    /// @param runId The run.
    /// @param version The new version number.
    /// @param manifestDigest sha256 of the version's manifest (non-zero).
    /// @param recordDigest sha256 of the aggregation record that produced it.
    function publishVersion(bytes32 runId, uint64 version, bytes32 manifestDigest, bytes32 recordDigest) external {
        RunInfo storage r = _existingRun(runId);
        _onlyCoordinator(runId, r);
        if (version != r.latestVersion + 1) revert VersionNotNext(runId, version, r.latestVersion + 1);
        if (manifestDigest == bytes32(0)) revert RunZeroDigest();
        r.latestVersion = version;
        _versions[runId][version] = VersionInfo(manifestDigest, recordDigest, block.number, false);
        emit VersionPublished(runId, version, manifestDigest, recordDigest);
    }

    // ----------------------------------------------------------------------------------------
    // Commitments, randomness and verdicts
    // ----------------------------------------------------------------------------------------

    /// @notice Commit to a contribution's header digest for `version` of `runId`.
    /// @dev Staked, non-jailed workers only; latest - maxStaleness <= version <= latest. Records the
    ///      close of the commit's challenge window, and moves the release of stake already unbonding to
    ///      unbondingBlocks after it (ReleaseDelayed), so the stake behind the commit stays slashable.
    /// @param runId The run.
    /// @param version Model version the contribution was computed at.
    /// @param nonce Worker-chosen nonce; (worker, run, version, nonce) is unique.
    /// @param headerDigest sha256 of the signed header; unique across all commits.
    /// @return commitId The new commit's id.
    function commit(bytes32 runId, uint64 version, uint64 nonce, bytes32 headerDigest)
        external
        returns (uint256 commitId)
    {
        RunInfo storage r = _existingRun(runId);
        _onlyEligible(msg.sender, ROLE_WORKER);
        uint64 latest = r.latestVersion;
        if (version > latest) revert CommitVersionFromFuture(version, latest);
        if (uint256(version) + r.params.maxStaleness < latest) {
            revert CommitVersionTooStale(version, latest, r.params.maxStaleness);
        }
        if (headerDigest == bytes32(0)) revert CommitZeroDigest();
        bytes32 key = keccak256(abi.encode(runId, msg.sender, version, nonce));
        uint256 existing = _commitByKey[key];
        if (existing != 0) revert CommitDuplicate(runId, msg.sender, version, nonce, existing);
        existing = _commitByDigest[headerDigest];
        if (existing != 0) revert CommitDigestTaken(headerDigest, existing);
        commitId = ++_commitCount;
        _commitByKey[key] = commitId;
        _commitByDigest[headerDigest] = commitId;
        CommitInfo storage c = _commits[commitId];
        c.runId = runId;
        c.worker = msg.sender;
        c.version = version;
        c.nonce = nonce;
        c.headerDigest = headerDigest;
        c.commitBlock = uint64(block.number);
        emit Committed(commitId, runId, msg.sender, version, nonce, headerDigest);
        uint256 windowEnd = block.number + r.params.challengeWindowBlocks;
        if (windowEnd > _windowEnd[msg.sender]) _windowEnd[msg.sender] = windowEnd;
        StakeInfo storage s = _stakes[msg.sender];
        if (s.unbonding != 0 && windowEnd + _unbondingBlocks > s.releaseBlock) {
            s.releaseBlock = windowEnd + _unbondingBlocks;
            emit ReleaseDelayed(msg.sender, commitId, s.releaseBlock);
        }
    }

    /// @notice Record (on first call) and return the check randomness of `commitId`.
    /// @dev Randomness is blockhash(commitBlock + 1): callable once that block exists and while the
    ///      EVM still knows its hash (256 blocks); idempotent afterwards.
    /// @param commitId The commit.
    /// @return randomness The sealed randomness.
    function sealRandomness(uint256 commitId) external returns (bytes32 randomness) {
        CommitInfo storage c = _existingCommit(commitId);
        randomness = c.randomness;
        if (randomness != bytes32(0)) return randomness;
        uint256 target = uint256(c.commitBlock) + 1;
        if (block.number <= target) revert RandomnessNotYetAvailable(commitId, target, block.number);
        randomness = blockhash(target);
        if (randomness == bytes32(0)) revert RandomnessExpired(commitId, target);
        c.randomness = randomness;
        emit RandomnessSealed(commitId, randomness);
    }

    /// @notice Record the caller's verdict on `commitId`. Staked, non-jailed verifiers only, once
    ///         each, while block.number <= commitBlock + challengeWindowBlocks, and while the commit
    ///         has fewer than MAX_ATTESTATIONS verdicts equal to `ok` (passes and failures apart).
    /// @param commitId The commit.
    /// @param ok True if the contribution passed the check.
    /// @param evidenceDigest sha256 of the evidence document.
    function attest(uint256 commitId, bool ok, bytes32 evidenceDigest) external {
        CommitInfo storage c = _existingCommit(commitId);
        _onlyEligible(msg.sender, ROLE_VERIFIER);
        uint256 lastBlock = uint256(c.commitBlock) + _runs[c.runId].params.challengeWindowBlocks;
        if (block.number > lastBlock) revert AttestationWindowClosed(commitId, lastBlock, block.number);
        AttestationInfo storage a = _attestations[commitId][msg.sender];
        if (a.exists) revert AttestationDuplicate(commitId, msg.sender);
        if ((ok ? c.passCount : c.failCount) >= MAX_ATTESTATIONS) {
            revert AttestationLimitReached(commitId, ok, MAX_ATTESTATIONS);
        }
        a.exists = true;
        a.ok = ok;
        a.evidenceDigest = evidenceDigest;
        if (ok) {
            c.passCount += 1;
        } else {
            c.failCount += 1;
            _failingVerifiers[commitId].push(msg.sender);
        }
        emit Attested(commitId, msg.sender, ok, evidenceDigest, c.passCount, c.failCount);
    }

    /// @notice Slash the worker of `commitId`. Only the run's coordinator, once per commit, when
    ///         failing attestations reached the run's quorum.
    /// @dev Takes slashFractionBps of staked + unbonding (staked first), jails the worker, credits
    ///      verifierBountyBps of it in equal shares to the failing verifiers and burns the rest.
    /// @param commitId The commit.
    function slash(uint256 commitId) external nonReentrant {
        CommitInfo storage c = _existingCommit(commitId);
        RunInfo storage r = _runs[c.runId];
        _onlyCoordinator(c.runId, r);
        if (c.slashed) revert SlashAlreadyDone(commitId);
        if (c.failCount < r.params.attestationQuorum) {
            revert SlashQuorumNotReached(commitId, c.failCount, r.params.attestationQuorum);
        }
        c.slashed = true;
        address worker = c.worker;
        StakeInfo storage s = _stakes[worker];
        uint256 amount = ((s.staked + s.unbonding) * r.params.slashFractionBps) / BPS;
        uint256 fromStaked = amount < s.staked ? amount : s.staked;
        s.staked -= fromStaked;
        s.unbonding -= amount - fromStaked;
        _totalStaked -= fromStaked;
        _totalUnbonding -= amount - fromStaked;
        address[] storage failing = _failingVerifiers[commitId];
        uint256 n = failing.length;
        uint256 share = ((amount * r.params.verifierBountyBps) / BPS) / n;
        uint256 bounty = share * n;
        uint256 burned = amount - bounty;
        _totalBurned += burned;
        emit Slashed(commitId, worker, amount, bounty, burned);
        if (!s.jailed) {
            s.jailed = true;
            emit WorkerJailed(worker, commitId);
        }
        if (share != 0) {
            for (uint256 i = 0; i < n; ++i) {
                _claimable[failing[i]] += share;
                emit BountyCredited(failing[i], commitId, share);
            }
            _totalClaimable += bounty;
        }
        if (burned != 0) ERC20Burnable(address(_token)).burn(burned);
    }

    // ----------------------------------------------------------------------------------------
    // Rewards
    // ----------------------------------------------------------------------------------------

    /// @notice Credit rewards for `version` of `runId` from its pool. Only the run's coordinator,
    ///         once per (run, version >= 1 published), at most MAX_SETTLE_BATCH accounts, in total
    ///         at most rewardPerVersion.
    /// @param runId The run.
    /// @param version A published version (>= 1).
    /// @param accounts Accounts to credit (non-zero).
    /// @param amounts Amount credited to each account.
    function settle(bytes32 runId, uint64 version, address[] calldata accounts, uint256[] calldata amounts)
        external
    {
        RunInfo storage r = _existingRun(runId);
        _onlyCoordinator(runId, r);
        if (version == 0 || version > r.latestVersion) revert VersionNotPublished(runId, version, r.latestVersion);
        VersionInfo storage v = _versions[runId][version];
        if (v.settled) revert SettleAlreadyDone(runId, version);
        uint256 n = accounts.length;
        if (n != amounts.length) revert SettleLengthMismatch(n, amounts.length);
        if (n == 0 || n > MAX_SETTLE_BATCH) revert SettleBatchSize(n, MAX_SETTLE_BATCH);
        uint256 total = 0;
        for (uint256 i = 0; i < n; ++i) {
            if (accounts[i] == address(0)) revert SettleZeroAccount(i);
            total += amounts[i];
        }
        if (total > r.params.rewardPerVersion) revert SettleExceedsRewardPerVersion(total, r.params.rewardPerVersion);
        if (total > r.rewardPool) revert RunRewardPoolInsufficient(runId, r.rewardPool, total);
        v.settled = true;
        r.rewardPool -= total;
        _totalRewardPools -= total;
        _totalClaimable += total;
        for (uint256 i = 0; i < n; ++i) {
            _claimable[accounts[i]] += amounts[i];
            emit RewardCredited(runId, version, accounts[i], amounts[i]);
        }
        emit VersionSettled(runId, version, n, total);
    }

    /// @notice Pay the caller all its credits (rewards and bounties).
    function claim() external nonReentrant {
        uint256 amount = _claimable[msg.sender];
        if (amount == 0) revert ClaimNothing(msg.sender);
        _claimable[msg.sender] = 0;
        _totalClaimable -= amount;
        emit Claimed(msg.sender, amount);
        _token.safeTransfer(msg.sender, amount);
    }

    // ----------------------------------------------------------------------------------------
    // Views
    // ----------------------------------------------------------------------------------------

    /// @notice The stake and reward token.
    function token() external view returns (IERC20) {
        return _token;
    }

    /// @notice Blocks from an unstake request (or the close of the latest commit's window, if later) to its release.
    function unbondingBlocks() external view returns (uint256) {
        return _unbondingBlocks;
    }

    /// @notice The longest challenge window of any run created so far.
    function maxChallengeWindow() external view returns (uint256) {
        return _maxChallengeWindow;
    }

    /// @notice Minimum staked balance of an eligible participant in `role`.
    function minimumStake(uint8 role) external view returns (uint256) {
        return _minimumStake[role];
    }

    /// @notice Last block of the challenge window of `account`'s latest-closing commit (0: none).
    /// @param account The account.
    /// @return The block.
    function windowEndOf(address account) external view returns (uint256) {
        return _windowEnd[account];
    }

    /// @notice Stake record of `account`.
    function stakeOf(address account) external view returns (StakeInfo memory) {
        return _stakes[account];
    }

    /// @notice Whether `account` may act as `role` now (staked at least the minimum, not jailed).
    function isEligible(address account, uint8 role) external view returns (bool) {
        return _eligible(account, role);
    }

    /// @notice State of run `runId` (exists = false if unknown).
    function runOf(bytes32 runId) external view returns (RunInfo memory) {
        return _runs[runId];
    }

    /// @notice Version `version` of run `runId` (zero digests if unpublished).
    function versionOf(bytes32 runId, uint64 version) external view returns (VersionInfo memory) {
        return _versions[runId][version];
    }

    /// @notice Number of commits so far (ids run from 1 to this).
    function commitCount() external view returns (uint256) {
        return _commitCount;
    }

    /// @notice Commit `commitId` (worker = zero address if unknown).
    function commitOf(uint256 commitId) external view returns (CommitInfo memory) {
        return _commits[commitId];
    }

    /// @notice Id of the commit by `worker` for (run, version, nonce), or 0.
    function commitIdOf(bytes32 runId, address worker, uint64 version, uint64 nonce) external view returns (uint256) {
        return _commitByKey[keccak256(abi.encode(runId, worker, version, nonce))];
    }

    /// @notice Id of the commit of `headerDigest`, or 0.
    function commitIdByDigest(bytes32 headerDigest) external view returns (uint256) {
        return _commitByDigest[headerDigest];
    }

    /// @notice Sealed check randomness of `commitId`, or zero if not sealed.
    function randomnessOf(uint256 commitId) external view returns (bytes32) {
        return _commits[commitId].randomness;
    }

    /// @notice Whether the verifier with `verifierKey` is selected to check `commitId`:
    ///         uint256(keccak256(abi.encode(randomness, commitId, verifierKey))) % PPM < checkProbabilityPpm.
    /// @dev Reverts with RandomnessNotSealed until sealRandomness was called.
    function isCheckSelected(uint256 commitId, bytes32 verifierKey) external view returns (bool) {
        CommitInfo storage c = _existingCommit(commitId);
        if (c.randomness == bytes32(0)) revert RandomnessNotSealed(commitId);
        uint256 draw = uint256(keccak256(abi.encode(c.randomness, commitId, verifierKey))) % PPM;
        return draw < _runs[c.runId].params.checkProbabilityPpm;
    }

    /// @notice Verdict of `verifier` on `commitId` (exists = false if none).
    function attestationOf(uint256 commitId, address verifier) external view returns (AttestationInfo memory) {
        return _attestations[commitId][verifier];
    }

    /// @notice Verifiers who attested failure of `commitId`, in order (at most MAX_ATTESTATIONS).
    function failingVerifiersOf(uint256 commitId) external view returns (address[] memory) {
        return _failingVerifiers[commitId];
    }

    /// @notice Credits `account` can claim.
    function claimableOf(address account) external view returns (uint256) {
        return _claimable[account];
    }

    /// @notice Sum of all staked balances.
    function totalStaked() external view returns (uint256) {
        return _totalStaked;
    }

    /// @notice Sum of all unbonding balances.
    function totalUnbonding() external view returns (uint256) {
        return _totalUnbonding;
    }

    /// @notice Sum of all runs' reward pools.
    function totalRewardPools() external view returns (uint256) {
        return _totalRewardPools;
    }

    /// @notice Sum of all unclaimed credits.
    function totalClaimable() external view returns (uint256) {
        return _totalClaimable;
    }

    /// @notice Tokens burned by slashes so far.
    function totalBurned() external view returns (uint256) {
        return _totalBurned;
    }

    // ----------------------------------------------------------------------------------------
    // Internal
    // ----------------------------------------------------------------------------------------

    function _requireValidRole(uint8 role) private pure {
        if (role != ROLE_WORKER && role != ROLE_VERIFIER) revert StakeInvalidRole(role);
    }

    function _eligible(address account, uint8 role) private view returns (bool) {
        StakeInfo storage s = _stakes[account];
        return s.role == role && !s.jailed && s.staked != 0 && s.staked >= _minimumStake[role];
    }

    function _onlyEligible(address account, uint8 role) private view {
        if (_stakes[account].jailed) revert StakeJailed(account);
        if (!_eligible(account, role)) revert StakeNotEligible(account, role);
    }

    function _existingRun(bytes32 runId) private view returns (RunInfo storage r) {
        r = _runs[runId];
        if (!r.exists) revert RunUnknown(runId);
    }

    function _existingCommit(uint256 commitId) private view returns (CommitInfo storage c) {
        c = _commits[commitId];
        if (c.worker == address(0)) revert CommitUnknown(commitId);
    }

    function _onlyCoordinator(bytes32 runId, RunInfo storage r) private view {
        if (msg.sender != r.params.coordinator) revert RunNotCoordinator(runId, msg.sender);
    }
}
