"""The Krill worker role (imported as krill.worker). Depends on the core, never on another role."""
