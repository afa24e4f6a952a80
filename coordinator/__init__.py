"""The Krill coordinator role (imported as krill.coordinator). Depends on the core, never on another role."""
