"""Core sub-commands of `krill`. Each module imports heavy libraries inside its functions."""
