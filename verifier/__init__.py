"""The Krill verifier role (imported as krill.verifier). Depends on the core, never on another role."""
