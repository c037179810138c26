"""The generators behind the docs' generated blocks: `python -m tools.docgen`."""
