"""Krill: reinforcement-learning post-training on untrusted hardware, audited from public data.

The core package (`krill`) holds what every role shares: configuration, identities, the chain
client, the content store, payload formats, the model and the RL maths. Role packages
(`krill.worker`, `krill.verifier`, `krill.coordinator`, `krill.explorer`) depend on the core and
never on each other; the core never imports a role.
"""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
