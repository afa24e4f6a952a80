"""Deployment configuration: one TOML file, validated by pydantic, overridable by env and flags.

Design decisions:
- One model per concern (chain, store, database, keystore, run) and one per role; every field
  documented and bounded. Pluggable parts are unions selected by a `type` field.
- Precedence, lowest first: model defaults < TOML file < environment (`KRILL_<SECTION>__<FIELD>`,
  e.g. `KRILL_CHAIN__RPC_URL`) < CLI `--set section.field=value`. An override's type comes from
  the field it sets: a number, boolean or list is parsed as a TOML value (`--set
  worker.max_contributions=16` is an int); a secret (`keystore.password`) is taken byte for byte,
  because a password such as `123456`, `true`, ` x` or `"quoted"` must reach the keystore
  unchanged. Other strings (URLs, paths, addresses, names) are taken as written less surrounding
  spaces, or may be written as a TOML string literal (`"..."`), which is unquoted: none of them
  starts and ends with a quote, and `krill devnet up` writes them so.
- A `[store]` table without `type` is the default local store, so `--set store.path=...` works
  without a config file. An override that changes a section's `type` (`KRILL_STORE__TYPE=kubo`)
  replaces the section: the lower layer's settings of the other type (the file's `path`) do not
  carry over, or no file written for one store could be pointed at another by overrides.
- An invalid value is reported with its key as the file spells it (`store.path`, not pydantic's
  `store.kubo.path`) and, when an override set it, which one (`--set worker.threads`, the variable
  `KRILL_WORKER__THREADS`): an error blamed on the file sends the reader to the wrong place.
- Validators only validate; nothing rewrites another section.
- The core never imports a role (STYLE.md), so the worker strategies' names that `worker.behavior`
  admits are listed here (`WORKER_BEHAVIORS`); the worker's registry checks itself against them.
- `masked()` renders the effective configuration with secrets (passwords, URL credentials, API
  keys in query strings) replaced, for `krill config show`.
"""

from __future__ import annotations

import os
import re
import tomllib
import types
from pathlib import Path, PurePath
from typing import Annotated, Any, Literal, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from krill.errors import ConfigError

ENV_PREFIX = "KRILL_"


def krill_home() -> Path:
    """The directory for keystores, devnet state and caches (`KRILL_HOME`, default ~/.krill)."""
    return Path(os.environ.get("KRILL_HOME", Path.home() / ".krill")).expanduser()


class _Section(BaseModel):
    # `nan` and `inf` are refused as such: bounded fields refused them with "should be less than or equal to
    # 300", which sends a reader who wrote `nan` looking for a value over the bound.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


def _check_shards(value: list[int] | None) -> list[int] | None:
    if value is None:
        return value
    if not value:
        raise ValueError("must name at least one shard (leave it unset for all)")
    if any(s < 0 for s in value):
        raise ValueError(f"shard numbers start at 0, got {sorted(s for s in value if s < 0)}")
    if len(set(value)) != len(value):
        raise ValueError(f"names a shard twice: {sorted({s for s in value if value.count(s) > 1})}")
    return value


Shards = Annotated[list[int] | None, AfterValidator(_check_shards)]


DEVNET_CHAIN_IDS = (31337,)  # Anvil's: a local chain, whose blocks are never reorganised
LIVE_CONFIRMATIONS = 12  # the default depth on any other chain (a few minutes on Ethereum, seconds on L2s)


class ChainConfig(_Section):
    """Where the Krill contracts live and how to talk to the chain."""

    rpc_url: str = Field("http://127.0.0.1:8545", description="EVM JSON-RPC endpoint (http or https).")
    chain_id: int | None = Field(None, ge=1, description="Expected chain id; checked on connect when set.")
    protocol_address: str | None = Field(None, pattern=r"^0x[0-9a-fA-F]{40}$",
                                         description="Address of the deployed KrillProtocol contract.")
    token_address: str | None = Field(None, pattern=r"^0x[0-9a-fA-F]{40}$",
                                      description="Address of the KrillToken stake/reward token.")
    deploy_block: int = Field(0, ge=0, description="Block the protocol was deployed in; event scans start here.")
    confirmations: int | None = Field(None, ge=0, le=64, description=(
        "Blocks an event must be buried under before it is acted on; unset: 0 on a local devnet (chain id "
        f"{', '.join(map(str, DEVNET_CHAIN_IDS))}), {LIVE_CONFIRMATIONS} on any other chain, whose blocks can be "
        "reorganised (the index detects a reorg of a block it already read and stops, but does not undo it), and "
        "at most an eighth of the run's challenge window for the roles that know it."))
    request_timeout_s: float = Field(10.0, gt=0, le=300, description="Timeout of one JSON-RPC request.")
    retries: int = Field(5, ge=0, le=50, description="Retries of a transient RPC failure, with exponential back-off.")
    poll_interval_s: float = Field(0.5, gt=0, le=60, description="How often to poll for new blocks and receipts.")
    receipt_timeout_s: float = Field(120.0, gt=0, le=3600, description=(
        "How long a write waits for its receipt (fee replacements included) before it fails as not in the chain; "
        "the role's loop then retries it."))
    fee_bump_after_s: float = Field(30.0, gt=0, le=3600, description=(
        "A write still pending this long since it was last sent is sent again under its nonce with fees raised by "
        "12.5% (its tip too low); one the base fee outgrew is replaced at once."))
    fee_bump_cap_factor: float = Field(4.0, ge=1, le=100, description=(
        "A replacement's maxFeePerGas stays under this multiple of the write's first maxFeePerGas."))
    fee_bump_cap_gwei: float | None = Field(None, gt=0, le=1e9, description=(
        "When set, a replacement's maxFeePerGas stays under this many gwei instead of the multiple above."))

    def confirmations_on(self, chain_id: int, window_blocks: int | None = None) -> int:
        """`confirmations`, or its default on chain `chain_id` where unset: a role that knows the run's
        challenge window (`window_blocks`) waits at most an eighth of it, since every block waited is one
        less to replay, attest and corroborate in (a verdict attested late in the window reaches the
        other verifiers `confirmations` blocks later)."""
        if self.confirmations is not None:
            return self.confirmations
        if chain_id in DEVNET_CHAIN_IDS:
            return 0
        return LIVE_CONFIRMATIONS if window_blocks is None else max(1, min(LIVE_CONFIRMATIONS, window_blocks // 8))

    @field_validator("rpc_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        # Krill talks JSON-RPC over HTTP (chain/rpc.py) and derives the WebSocket URL from it (chain/heads.py).
        return _http_url(value, "http://127.0.0.1:8545")


def _http_url(value: str, example: str) -> str:
    """`value` if it is an http(s) URL with a host, else a ValueError naming what is expected."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL with a host, e.g. {example}, got {value!r}")
    return value


class LocalStoreConfig(_Section):
    """The embedded content store: a content-addressed directory shared by processes on one host."""

    type: Literal["local"] = "local"
    path: Path = Field(default_factory=lambda: krill_home() / "store", description="Directory of the store.")
    max_get_bytes: int = Field(1 << 30, ge=1, description="Largest object a get will return.")


class KuboStoreConfig(_Section):
    """A Kubo (go-ipfs) daemon reached through its HTTP RPC API."""

    type: Literal["kubo"] = "kubo"
    api_url: str = Field("http://127.0.0.1:5001", description="Base URL of the Kubo RPC API.")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="Timeout of one RPC call.")
    max_get_bytes: int = Field(1 << 30, ge=1, description="Largest object a get will return.")

    @field_validator("api_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        # checked at load, as chain.rpc_url is: a value like `notaurl` failed only at a role's first store call
        return _http_url(value, "http://127.0.0.1:5001")


class EmbeddedKuboStoreConfig(_Section):
    """A Kubo node running inside this process (optional extra `krill[p2p]`)."""

    type: Literal["embedded-kubo"] = "embedded-kubo"
    repo_path: Path = Field(default_factory=lambda: krill_home() / "ipfs", description="IPFS repo directory.")
    swarm_addresses: list[str] = Field(default_factory=lambda: ["/ip4/127.0.0.1/tcp/0"],
                                       description="Multiaddresses to listen on; loopback unless set.")
    bootstrap: list[str] = Field(default_factory=list, description="Peer multiaddresses to connect to at start.")
    max_get_bytes: int = Field(1 << 30, ge=1, description="Largest object a get will return.")
    timeout_s: float = Field(60.0, gt=0, le=3600, description="Timeout of one fetch from the network.")


def _store_type(value: Any) -> str | None:
    # A table without `type` is the default store; pydantic's plain discriminator requires the tag.
    return value.get("type", "local") if isinstance(value, dict) else getattr(value, "type", None)


StoreConfig = Annotated[
    Annotated[LocalStoreConfig, Tag("local")] | Annotated[KuboStoreConfig, Tag("kubo")]
    | Annotated[EmbeddedKuboStoreConfig, Tag("embedded-kubo")],
    Discriminator(_store_type, custom_error_type="store_type",
                  custom_error_message="unknown store type; choose local, kubo or embedded-kubo")]


class DatabaseConfig(_Section):
    """The local index: SQLite by default, PostgreSQL by URL."""

    url: str = Field(default_factory=lambda: f"sqlite:///{krill_home() / 'krill.db'}",
                     description="SQLAlchemy URL, e.g. sqlite:///path.db or postgresql+psycopg://user@host/db.")

    @field_validator("url")
    @classmethod
    def _supported_url(cls, value: str) -> str:
        # The backends krill/db/session.py opens, with their synchronous drivers; checked here so a typo
        # (`postgresql+pyscopg`) fails at load, not at first use. The URL is shown with its password masked.
        if not re.match(r"^(sqlite(\+pysqlite)?|postgresql(\+(psycopg|psycopg2))?)://", value):
            raise ValueError(f"expected a sqlite:///path.db or postgresql+psycopg://user@host/db URL (drivers: "
                             f"sqlite, sqlite+pysqlite, postgresql, postgresql+psycopg, postgresql+psycopg2), got "
                             f"{_mask(value)!r}")
        return value


class KeystoreConfig(_Section):
    """This participant's identity: an encrypted keystore file."""

    path: Path | None = Field(None, description="Keystore file; default: the only one in $KRILL_HOME/keys.")
    password: SecretStr | None = Field(None, description="Keystore password (prefer KRILL_KEYSTORE__PASSWORD or a prompt).")


class RunConfig(_Section):
    """Which training run this deployment takes part in."""

    id: str | None = Field(None, pattern=r"^(0x)?[0-9a-fA-F]{64}$",
                           description="On-chain run id (sha256 of the run spec), 64 hex digits.")


class _RoleSection(_Section):
    poll_interval_s: float = Field(0.5, gt=0, le=60, description="How often to look at the chain for news.")
    threads: int = Field(1, ge=1, le=256, description="torch threads (1 is fastest for tiny models on shared cores).")
    nice: int = Field(0, ge=0, le=19, description="Lower this process's CPU priority by this much at start "
                      "(Unix nice; 0: unchanged): a verifier, which checks within a window of blocks, can "
                      "give way to a worker or coordinator it shares a machine with.")
    max_backoff_s: float = Field(30.0, gt=0, le=3600, description="Longest wait between retries when chain or store fail.")
    state_dir: Path | None = Field(None, description="Private working state; default $KRILL_HOME/<role>/<address>.")


# The names `worker.behavior` admits. The strategies themselves live in the worker's folder
# (`worker/behaviors.py`), which the core never imports; that module checks at import that its registry
# has exactly these names, so the two cannot drift apart.
WORKER_BEHAVIORS: tuple[str, ...] = (
    "honest", "forge-rewards", "fabricate-rollouts", "lazy", "cherry-pick", "stale-behaviour",
    "sign-flip", "scale", "noise", "alie", "ipm", "mimic", "copycat", "foreign-signature", "forged-signature",
    "future-version", "too-stale-version", "withhold")


class WorkerConfig(_RoleSection):
    """Settings of `krill worker run`."""

    behavior: str = Field(
        "honest", description="Strategy; anything but 'honest' is an attack, for tests, demos and benchmarks "
                              "(`krill worker run --help` lists them).")
    shards: Shards = Field(None, description="Shards to compute gradients for; default all.")
    max_contributions: int | None = Field(None, ge=1, description="Stop after this many commits (default: run on).")
    max_per_version: int | None = Field(2, ge=1, description="Commits per published version before waiting for the "
                                        "next one (work beyond what a version folds only goes stale); None: no limit.")
    sample_ahead: bool = Field(False, description="With this version's share committed (max_per_version), sample "
                               "the next contribution's rollouts at it and take their gradient at the next version "
                               "(rollouts one version behind; sampling off the version's critical path).")
    stake: int = Field(500 * 10**18, ge=1, description="Stake (token base units) that `krill worker stake` deposits.")
    watch_interval_s: float = Field(0.25, ge=0, le=60, description="How often a background thread reads the newest "
                                    "version and fetches a new one's shards; 0: the worker reads the chain itself "
                                    "when it needs the newest version.")

    @field_validator("behavior")
    @classmethod
    def _known_behavior(cls, value: str) -> str:
        if value not in WORKER_BEHAVIORS:
            raise ValueError(f"unknown strategy {value!r}; choose one of {', '.join(sorted(WORKER_BEHAVIORS))}")
        return value


class VerifierConfig(_RoleSection):
    """Settings of `krill verifier run`."""

    stake: int = Field(500 * 10**18, ge=1, description="Stake (token base units) that `krill verifier stake` deposits.")
    calibration: Path | None = Field(None, description="Tolerance table from `krill calibrate` on this machine; the "
                                     "verifier applies, per tolerance, the looser of it and the run spec's. Default: "
                                     "the table shipped with Krill.")


class CoordinatorConfig(_RoleSection):
    """Settings of `krill coordinator run`."""

    shards: Shards = Field(None, description="Shards this coordinator serves; default all.")
    eval_every: int = Field(5, ge=0, le=100_000, description="Evaluate every this many versions (0: never).")
    max_versions: int | None = Field(None, ge=1, description=(
        "Stop after publishing this version, once no failing quorum is left to slash or refute (default: run on)."))
    optimizer_state_every: int = Field(
        10, ge=1, le=1000,
        description="Store the AdamW states (twice the weights' bytes) at every this many versions (1: all). The "
                    "record names the others by sha256, and a restarted coordinator or `krill audit` replays the "
                    "folds since the last stored ones.")
    allow_short_unbonding: bool = Field(
        False, description="Start even where the protocol's unbondingBlocks leave too few seconds after a challenge "
                           "window (at the chain's block time) to confirm withheld content and slash it before the "
                           "worker withdraws (`krill coordinator run` refuses by default, naming the figures).")


class ExplorerConfig(_Section):
    """Settings of `krill explorer` (read-only web pages and JSON API over the index)."""

    host: str = Field("127.0.0.1", min_length=1, max_length=255,
                      description="Address to listen on (127.0.0.1: this machine only).")
    port: int = Field(8750, ge=0, le=65535, description="TCP port to listen on (0: any free port).")
    page_size: int = Field(25, ge=1, le=1000, description="Rows per page when a request names no per_page.")
    max_page_size: int = Field(200, ge=1, le=5000, description="Largest per_page a request may ask for.")
    audit_report: Path | None = Field(None, description="`krill audit --json` output (or a demo summary.json) "
                                      "whose per-version results the pages show; re-read when it changes.")
    use_store: bool = Field(True, description="Read aggregation records, evidence and headers from the store.")

    @model_validator(mode="after")
    def _default_page_fits(self) -> ExplorerConfig:
        if self.page_size > self.max_page_size:
            raise ValueError(f"page_size {self.page_size} is over max_page_size {self.max_page_size}")
        return self


class KrillConfig(_Section):
    """The whole deployment configuration."""

    chain: ChainConfig = Field(default_factory=ChainConfig)
    store: StoreConfig = Field(default_factory=LocalStoreConfig)
    database: DatabaseConfig = Field(default_factory=DatabaseConfig)
    keystore: KeystoreConfig = Field(default_factory=KeystoreConfig)
    run: RunConfig = Field(default_factory=RunConfig)
    worker: WorkerConfig = Field(default_factory=WorkerConfig)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    coordinator: CoordinatorConfig = Field(default_factory=CoordinatorConfig)
    explorer: ExplorerConfig = Field(default_factory=ExplorerConfig)

    def masked(self) -> dict[str, Any]:
        """The configuration as plain data with every secret masked."""
        return _mask(self.model_dump(mode="json"))


_SECRET_KEYS = re.compile(r"(password|secret|token_key|api_key|private)", re.I)
_URL_CREDS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@]+)(:(?P<pw>[^@]*))?@", re.I)
# Hosted RPC endpoints carry their API key in the path (`https://eth-mainnet.g.alchemy.com/v2/KEY`).
_URL_PATH = re.compile(r"^(?P<base>[a-z][a-z0-9+.-]*://[^/?#]+)/[^?#]+", re.I)
_QUERY_SECRET = re.compile(r"([?&](?:key|apikey|api_key|token|secret)=)[^&]+", re.I)


def _mask(value: Any, key: str = "") -> Any:
    if isinstance(value, dict):
        return {k: _mask(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v, key) for v in value]
    if isinstance(value, str):
        if _SECRET_KEYS.search(key) and value:
            return "********"
        value = _URL_CREDS.sub(lambda m: f"{m['scheme']}{m['user']}{':********' if m['pw'] is not None else ''}@", value)
        if key == "rpc_url":
            value = _URL_PATH.sub(r"\g<base>/********", value)
        return _QUERY_SECRET.sub(r"\1********", value)
    return value


def default_config_path() -> Path | None:
    """`KRILL_CONFIG`, else the config the running devnet wrote, else none."""
    env = os.environ.get("KRILL_CONFIG")
    if env:
        return Path(env).expanduser()
    devnet = krill_home() / "devnet" / "config.toml"
    return devnet if devnet.exists() else None


def _members(annotation: Any) -> list[Any]:
    """The types a field annotation admits, through `Annotated` and unions."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _members(get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        return [m for arg in get_args(annotation) for m in _members(arg)]
    return [annotation]


def _field_types(dotted: str) -> list[Any]:
    """Every type the field at `dotted` may take (a union section, like `store`, adds each variant's)."""
    parts = [p for p in dotted.split(".") if p]
    models: list[type[BaseModel]] = [KrillConfig]
    for part in parts[:-1]:
        models = [m for model in models if part in model.model_fields
                  for m in _members(model.model_fields[part].annotation)
                  if isinstance(m, type) and issubclass(m, BaseModel)]
    return [t for model in models if parts and parts[-1] in model.model_fields
            for t in _members(model.model_fields[parts[-1]].annotation) if t is not type(None)]


def _admits_none(dotted: str) -> bool:
    """Whether the field at `dotted` may be None (its default or `none` / `null` in an override)."""
    parts = [p for p in dotted.split(".") if p]
    if len(parts) != 2 or parts[0] not in KrillConfig.model_fields:
        return False
    sections = [m for m in _members(KrillConfig.model_fields[parts[0]].annotation)
                if isinstance(m, type) and issubclass(m, BaseModel)]
    return any(parts[1] in m.model_fields and type(None) in _members(m.model_fields[parts[1]].annotation)
               for m in sections)


def _is_text(kind: Any) -> bool:
    if get_origin(kind) is Literal:
        return all(isinstance(v, str) for v in get_args(kind))
    return kind is str or kind is SecretStr or (isinstance(kind, type) and issubclass(kind, PurePath))


def _parse_value(dotted: str, text: str) -> Any:
    """An override's value, typed by the field it sets (see the module docstring)."""
    kinds = _field_types(dotted)
    if kinds and SecretStr in kinds:
        return text
    if text.strip().lower() in ("none", "null") and _admits_none(dotted):
        return None  # TOML has no null: the only way to clear an optional field (e.g. worker.max_per_version)
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text
    if kinds and all(_is_text(k) for k in kinds):
        return value if isinstance(value, str) and text.lstrip()[:1] in ("'", '"') else text.strip()
    return value


def _tags_of(annotation: Any) -> dict[str, Any]:
    """The variants of a pluggable part (a union of models told apart by `type`), by their `type` tag;
    empty for anything else."""
    variants = [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)
                and "type" in m.model_fields]
    if len(variants) < 2:
        return {}
    return {get_args(m.model_fields["type"].annotation)[0]: m for m in variants}


def _union_tags(section: str) -> dict[str, Any]:
    """The variants of a pluggable section (`store`), by their `type` tag; empty for a plain section."""
    field = KrillConfig.model_fields.get(section)
    return {} if field is None else _tags_of(field.annotation)


def _default_type(section: str) -> Any:
    return getattr(KrillConfig.model_fields[section].get_default(call_default_factory=True), "type", None)


def _apply_layer(data: dict, items: list[tuple[str, Any, str]], origins: dict[tuple[str, ...], str]) -> None:
    """Apply one layer of overrides (all of the environment, or all `--set`s): `(dotted, value, origin)`.

    A layer that sets a pluggable section's `type` to another than the one below replaces that section
    (see the module docstring); what the layer sets itself is kept whatever its order."""
    for dotted, value, _ in items:
        parts = [p for p in dotted.split(".") if p]
        if len(parts) == 2 and parts[1] == "type" and _union_tags(parts[0]) and isinstance(data.get(parts[0]), dict):
            below = data[parts[0]].get("type", _default_type(parts[0]))
            if value != below:
                data[parts[0]] = {}
    for dotted, value, origin in items:
        _set_path(data, dotted, value, origin)
        origins[tuple(p for p in dotted.split(".") if p)] = origin


def _error_key(loc: tuple, model: type[BaseModel] = KrillConfig) -> tuple[str, ...]:
    """A validation error's location in `model` as the file spells the key: without pydantic's union tags
    (`store.kubo.path` is `store.path`, a run spec's `rule.trimmed-mean.bogus` is `rule.bogus`)."""
    parts = [str(p) for p in loc]
    key: list[str] = []
    models: list[Any] = [model]
    while parts:
        part = parts.pop(0)
        key.append(part)
        fields = [m.model_fields[part] for m in models if part in m.model_fields]
        tags = {t: v for f in fields for t, v in _tags_of(f.annotation).items()}
        if tags and parts and parts[0] in tags:
            models = [tags[parts.pop(0)]]
        else:
            models = [m for f in fields for m in _members(f.annotation) if isinstance(m, type) and issubclass(m, BaseModel)]
    return tuple(key)


def validation_errors(exc: ValidationError, model: type[BaseModel] = KrillConfig) -> list[tuple[tuple[str, ...], str]]:
    """Each error of `exc` (raised validating `model`) as (its key as a TOML file spells it, its message without
    pydantic's decoration), for one-line errors that send the reader to the right key."""
    return [(_error_key(e["loc"], model), e["msg"].removeprefix("Value error, ")) for e in exc.errors()]


def describe_errors(errors: list[tuple[tuple[str, ...], str]]) -> str:
    """`validation_errors` as one line: `key: message; ...` (a whole-model error has no key)."""
    return "; ".join(f"{'.'.join(key)}: {message}" if key else message for key, message in errors)


def _error_origin(key: tuple[str, ...], origins: dict[tuple[str, ...], str]) -> str | None:
    """The override that set `key` (or the section or value holding it), if one did."""
    for n in range(len(key), 0, -1):
        if key[:n] in origins:
            return origins[key[:n]]
    if len(key) == 1 and _union_tags(key[0]):  # the section's own error is its `type`'s
        return origins.get((*key, "type"))
    return next((origin for path, origin in origins.items() if path[:len(key)] == key), None)


def _set_path(data: dict, dotted: str, value: Any, origin: str) -> None:
    parts = [p for p in dotted.split(".") if p]
    if len(parts) < 2:
        raise ConfigError(f"{origin}: '{dotted}' must name a section and a field, e.g. chain.rpc_url")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{origin}: '{dotted}' goes through a value that is not a section")
    node[parts[-1]] = value


def env_overrides(environ: dict[str, str] | None = None) -> list[tuple[str, Any]]:
    """Overrides from `KRILL_<SECTION>__<FIELD>` variables (double underscore between levels)."""
    environ = os.environ if environ is None else environ
    out = []
    for name, raw in sorted(environ.items()):
        if name.startswith(ENV_PREFIX) and "__" in name:
            dotted = name[len(ENV_PREFIX):].lower().replace("__", ".")
            out.append((dotted, _parse_value(dotted, raw)))
    return out


def load_config(path: Path | str | None = None, overrides: list[str] | tuple[str, ...] = (),
                environ: dict[str, str] | None = None) -> KrillConfig:
    """Load the effective configuration: defaults < file < environment < `section.field=value` overrides."""
    data: dict[str, Any] = {}
    path = Path(path) if path is not None else default_config_path()
    if path is not None:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist (run `krill devnet up` or pass --config)") from None
        except OSError as exc:  # a folder, no permission, a path through a file
            raise ConfigError(f"config file {path} cannot be read: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: not UTF-8 text ({exc.reason} at byte "
                              f"{exc.start})") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    origins: dict[tuple[str, ...], str] = {}
    _apply_layer(data, [(dotted, value, f"environment variable KRILL_{dotted.upper().replace('.', '__')}")
                        for dotted, value in env_overrides(environ)], origins)
    flags = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set '{item}': expected section.field=value")
        dotted, raw = item.split("=", 1)
        dotted = dotted.strip()
        flags.append((dotted, _parse_value(dotted, raw), f"--set {dotted}"))
    _apply_layer(data, flags, origins)
    try:
        return KrillConfig.model_validate(data)
    except ValidationError as exc:
        lines, from_file = [], False
        for key, message in validation_errors(exc):
            origin = _error_origin(key, origins)
            from_file = from_file or origin is None
            lines.append(describe_errors([(key, message)]) + (f" (from {origin})" if origin else ""))
        where = f" in {path}" if path and from_file else ""
        raise ConfigError(f"invalid configuration{where}: {'; '.join(lines)}") from None


def write_config(config: KrillConfig, path: Path) -> None:
    """Write a configuration as TOML (secrets included: the file is made mode 0600)."""
    import tomli_w

    from krill.atomic_file import replace_file

    data = config.model_dump(mode="json", exclude_none=True)
    if config.keystore.password is not None:
        data["keystore"]["password"] = config.keystore.password.get_secret_value()
    replace_file(path, tomli_w.dumps(data))  # made 0600: the secrets are never readable by others
