"""The Krill explorer role (imported as krill.explorer). Depends on the core, never on another role."""
