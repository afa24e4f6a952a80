"""The calibration table: honest check records -> tolerances, distribution, TOML; and loading it back.

Design decisions:
- A *check* is one stage comparison of one contribution replayed once: the `resample` stage
  (re-sampled tokens and behaviour log-probs) or the `gradient` stage of one shard (cosine and
  relative norm difference of the claimed vs recomputed shard gradient). A contribution replayed
  under two replayer thread counts with two shards gives 2 x (1 + 2) = 6 checks.
- The margin rule (MARGIN = 10, floors below), applied to the worst honest value observed:
    logprob_abs_tol   = max(10 x max |log-prob diff|, 1e-4), the max taken over the re-sampled
                        AND the teacher-forced comparison, so `exact_resample` can be turned off
                        without recalibrating;
    grad_min_cosine   = 1 - min(max(10 x max (1 - cosine), 1e-4), 0.1)   (never below 0.9: a
                        gap that large means the check no longer tells work from noise, and the
                        honest failures it then causes are counted and reported, not hidden);
    grad_norm_rel_tol = max(10 x max relative norm difference, 1e-3);
    exact_resample    = no honest token mismatch was observed (else false: the verifier then
                        compares claimed log-probs teacher-forced, within logprob_abs_tol).
  Values are rounded outwards to two significant digits. Floors stand for what one machine cannot
  measure: another CPU's kernels (AVX2 vs AVX-512), another torch build.
- Per codec: gradient tolerances come from that codec's checks (int8 blocks are far coarser than
  fp16), resample tolerances from all checks (sampling does not depend on the codec). `[verify]`
  is the loosest over the codecs measured, so it can be pasted into any run spec.
- Loading (`verifier_tolerances`): per field the looser of the run spec's value and the table's
  value for the run's codec. The run spec stays the public rule; a verifier never fails honest
  work because its own hardware is noisier than the spec's authors' (it runs `krill calibrate`
  and points `verifier.calibration` at the result). Without a path, the shipped table.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from krill.errors import ConfigError
from krill.protocol.spec import VerifySpec

TABLE_FORMAT = "krill-calibration/1"
MARGIN = 10.0
LOGPROB_FLOOR = 1e-4
COSINE_GAP_FLOOR = 1e-4
COSINE_GAP_CAP = 0.1
NORM_REL_FLOOR = 1e-3
RULE = (f"logprob_abs_tol = max({MARGIN:g} x max |log-prob diff| (re-sampled and teacher-forced), {LOGPROB_FLOOR:g}); "
        f"grad_min_cosine = 1 - min(max({MARGIN:g} x max (1 - cosine), {COSINE_GAP_FLOOR:g}), {COSINE_GAP_CAP:g}); "
        f"grad_norm_rel_tol = max({MARGIN:g} x max relative norm difference, {NORM_REL_FLOOR:g}); "
        "exact_resample = no honest token mismatch observed; rounded outwards to 2 significant digits")
QUANTILES = (("p50", 0.5), ("p99", 0.99))


@dataclass
class HonestCheck:
    """One stage comparison of one honest contribution, and the condition it ran under."""

    stage: Literal["resample", "gradient"]
    batch: int  # prompts per contribution
    codec: str  # gradient codec of the run spec (fp16, bf16, int8)
    producer_threads: int
    replayer_threads: int
    version: int  # learner version
    behaviour_version: int
    shard: int | None = None
    token_mismatches: int = 0  # sequences whose re-sample differs
    max_logprob_diff: float = 0.0  # re-sampled vs claimed (only when tokens match)
    teacher_logprob_diff: float = 0.0  # teacher-forced vs claimed
    cosine: float = 1.0
    rel_norm_diff: float = 0.0
    zero_gradient: bool = False  # both claimed and recomputed gradients are zero
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def passes(check: HonestCheck, verify: VerifySpec) -> bool:
    """Whether `check_resample` / `check_gradient` would pass this comparison under `verify` (same rules)."""
    if check.stage == "resample":
        if check.token_mismatches == 0:
            return check.max_logprob_diff <= verify.logprob_abs_tol
        return not verify.exact_resample and check.teacher_logprob_diff <= verify.logprob_abs_tol
    if check.zero_gradient:
        return True
    return check.cosine >= verify.grad_min_cosine and check.rel_norm_diff <= verify.grad_norm_rel_tol


def _ceil2(x: float) -> float:
    """`x` rounded up to two significant digits."""
    if x <= 0:
        return 0.0
    scale = 10.0 ** (math.floor(math.log10(x)) - 1)
    return float(f"{math.ceil(x / scale - 1e-9) * scale:.3g}")


def tolerances(resample: list[HonestCheck], gradient: list[HonestCheck]) -> VerifySpec:
    """The margin rule (module docstring) applied to the worst honest figures."""
    lp = max((max(c.max_logprob_diff, c.teacher_logprob_diff) for c in resample), default=0.0)
    live = [c for c in gradient if not c.zero_gradient]
    gap = max((1.0 - c.cosine for c in live), default=0.0)
    rel = max((c.rel_norm_diff for c in live), default=0.0)
    gap_tol = min(_ceil2(max(MARGIN * gap, COSINE_GAP_FLOOR)), COSINE_GAP_CAP)
    return VerifySpec(logprob_abs_tol=min(_ceil2(max(MARGIN * lp, LOGPROB_FLOOR)), 10.0),
                      grad_min_cosine=float(f"{1.0 - gap_tol:.6g}"),
                      grad_norm_rel_tol=min(_ceil2(max(MARGIN * rel, NORM_REL_FLOOR)), 10.0),
                      exact_resample=all(c.token_mismatches == 0 for c in resample))


def looser(a: VerifySpec, b: VerifySpec) -> VerifySpec:
    """Per field, the tolerance that accepts more."""
    return VerifySpec(logprob_abs_tol=max(a.logprob_abs_tol, b.logprob_abs_tol),
                      grad_min_cosine=min(a.grad_min_cosine, b.grad_min_cosine),
                      grad_norm_rel_tol=max(a.grad_norm_rel_tol, b.grad_norm_rel_tol),
                      exact_resample=a.exact_resample and b.exact_resample)


def _quantiles(values: list[float]) -> dict[str, float | int]:
    import numpy as np

    if not values:
        return {"count": 0}
    arr = np.asarray(values, dtype=np.float64)
    out: dict[str, float | int] = {"count": len(values)}
    out.update({name: float(np.quantile(arr, q)) for name, q in QUANTILES})
    out["max"] = float(arr.max())
    return out


CONDITION = ("batch", "producer_threads", "replayer_threads", "codec")


def distribution(checks: list[HonestCheck]) -> list[dict[str, Any]]:
    """Per condition (batch, producer threads, replayer threads, codec): quantiles of every statistic.

    Cosine is reported as `one_minus_cosine` (its bad tail is the high one); zero-gradient checks
    (no reward variance in any group) are counted, not mixed into the gradient quantiles.
    """
    groups: dict[tuple, list[HonestCheck]] = {}
    for c in checks:
        groups.setdefault(tuple(getattr(c, k) for k in CONDITION), []).append(c)
    rows = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3])):
        group = groups[key]
        res = [c for c in group if c.stage == "resample"]
        grad = [c for c in group if c.stage == "gradient" and not c.zero_gradient]
        rows.append({**dict(zip(CONDITION, key, strict=True)),
                     "checks": len(group), "resample_checks": len(res),
                     "gradient_checks": sum(c.stage == "gradient" for c in group),
                     "zero_gradient_checks": sum(c.zero_gradient for c in group),
                     "token_mismatches": _quantiles([float(c.token_mismatches) for c in res]),
                     "max_logprob_diff": _quantiles([c.max_logprob_diff for c in res if c.token_mismatches == 0]),
                     "teacher_logprob_diff": _quantiles([c.teacher_logprob_diff for c in res]),
                     "one_minus_cosine": _quantiles([1.0 - c.cosine for c in grad]),
                     "rel_norm_diff": _quantiles([c.rel_norm_diff for c in grad])})
    return rows


def build_table(checks: list[HonestCheck], meta: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    """The whole table as plain data (TOML-ready): tolerances, failures, distribution, machine facts."""
    resample = [c for c in checks if c.stage == "resample"]
    codecs = sorted({c.codec for c in checks})
    per_codec = {codec: tolerances(resample, [c for c in checks if c.stage == "gradient" and c.codec == codec])
                 for codec in codecs}
    overall = tolerances(resample, [c for c in checks if c.stage == "gradient"])
    failures = sum(not passes(c, per_codec[c.codec]) for c in checks)
    at_defaults = sum(not passes(c, VerifySpec()) for c in checks)
    return {
        "format": TABLE_FORMAT,
        "date_utc": machine.get("date_utc", ""),
        "rule": RULE,
        "check_definition": "one stage comparison (resample, or the gradient of one shard) of one honest "
                            "contribution replayed once",
        "checks": len(checks),
        "honest_failures": failures,
        "honest_failures_at_spec_defaults": at_defaults,
        "token_mismatch_note": ("no honest token mismatch: exact re-sampling holds, exact_resample = true"
                                if overall.exact_resample else
                                "honest token mismatches occurred: exact_resample = false, the verifier compares "
                                "the claimed log-probs teacher-forced within logprob_abs_tol"),
        "verify": overall.model_dump(),
        "codec": {codec: {"verify": v.model_dump()} for codec, v in per_codec.items()},
        "run": meta,
        "machine": machine,
        "distribution": distribution(checks),
    }


def write_table(table: dict[str, Any], path: Path) -> Path:
    import tomli_w

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = ("# Krill verification tolerances, measured on honest work by `krill calibrate`.\n"
              "# Paste [verify] into a run spec (`krill coordinator create-run --spec`), or point\n"
              "# `verifier.calibration` at this file: the verifier applies the looser of it and the run spec.\n\n")
    path.write_text(header + tomli_w.dumps(_toml_ready(table)), encoding="utf-8")
    return path


def _toml_ready(value: Any) -> Any:
    """TOML has no null: drop None values (machine facts may lack some)."""
    if isinstance(value, dict):
        return {k: _toml_ready(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_toml_ready(v) for v in value if v is not None]
    return value


# ------------------------------------------------------------------ loading (the verifier's side)


class _CodecSection(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    verify: VerifySpec


class CalibrationTable(BaseModel):
    """The parts of a table the verifier uses (the rest is for people)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    format: Literal["krill-calibration/1"]
    verify: VerifySpec
    codec: dict[Literal["fp16", "bf16", "int8"], _CodecSection] = {}

    def tolerances_for(self, codec: str) -> VerifySpec:
        """The codec's tolerances when measured, else the table's overall `[verify]`."""
        section = self.codec.get(codec)
        return section.verify if section is not None else self.verify


def shipped_table_path() -> Path:
    """The table shipped with Krill (package data of `krill.protocol`)."""
    return Path(str(files("krill.protocol") / "calibration.toml"))


def load_table(path: str | Path | None = None) -> CalibrationTable:
    """Read and validate a table (default: the shipped one)."""
    path = Path(path) if path is not None else shipped_table_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"calibration table {path} does not exist: write one with `krill calibrate --out {path}`") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"calibration table {path} is not valid TOML: {exc}") from None
    try:
        return CalibrationTable.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"calibration table {path}: {exc}") from None


def verifier_tolerances(spec, path: str | Path | None = None) -> VerifySpec:
    """Per field the looser of the run spec's tolerances and the table's for the run's codec."""
    return looser(spec.verify, load_table(path).tolerances_for(spec.compression.dtype))
