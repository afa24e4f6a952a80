"""Calibrated verification tolerances: measure honest work, derive the tolerances, ship the table.

Design decisions:
- `measure` produces honest contributions in-process with the protocol's own functions (the
  worker's `sample` -> `learn` -> `package`, then the verifier's `check_resample` /
  `check_gradient` on the decoded payload) and records each comparison's statistics; `table`
  turns those records into tolerances (one documented margin rule), the measured distribution
  and the TOML table, and loads a table back for the verifier (the looser of the run spec's
  and the table's tolerance, per field).
- `table` imports no torch-heavy module of its own beyond the run spec, so the verifier and
  `krill calibrate --help` stay cheap; `measure` holds everything that needs models.
- The table shipped with Krill (`krill/protocol/calibration.toml`) was produced by a default
  `krill calibrate` run; `VerifySpec`'s defaults equal its `[verify]` table.
"""
