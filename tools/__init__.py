"""Developer tools for this repository (not shipped with the package)."""
