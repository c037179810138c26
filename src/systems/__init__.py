"""systems: benchmarks, kernels and distributed training for Transformer language models."""

__version__ = "0.1.0"
