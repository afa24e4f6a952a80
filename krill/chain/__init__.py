"""The chain side of Krill: the local devnet node, contract artifacts, and the typed client.

Import what you need from the submodules: `krill.chain.client.KrillChain`,
`krill.chain.deploy.deploy`, `krill.chain.rpc` (connections, dev accounts, devnet controls),
`krill.chain.events` (typed events), `krill.chain.errors` (one class per Solidity custom error).
Nothing heavy is imported here so that `import krill.chain.anvil` stays cheap.
"""
