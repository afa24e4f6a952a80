"""Which dev accounts the worker tests' fixture stakes, and the keystore password (importable by name)."""

from krill.chain.deploy import TOKEN

PASSWORD = "worker-test-password"
WORKERS = (2, 3, 4, 5, 6, 9)  # dev accounts staked as workers (9: jailed mid-run by its test)
UNSTAKED = 7  # funded, never staked by the fixture
VERIFIER = 8
STAKE = 200 * TOKEN
