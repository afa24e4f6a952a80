"""The protocol's public, shared definitions: run spec, masks, version step, aggregation record, evidence.

Everything here is a deterministic function of public data (chain + store), so the coordinator,
the verifiers, the workers and any auditor compute the same results from it. Roles import these;
nothing here imports a role.
"""
