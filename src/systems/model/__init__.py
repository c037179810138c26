"""Transformer LM, its configs and loss."""

from systems.model.config import MODEL_CONFIGS, ModelConfig, get_config
from systems.model.loss import cross_entropy
from systems.model.transformer import TransformerLM

__all__ = ["MODEL_CONFIGS", "ModelConfig", "TransformerLM", "cross_entropy", "get_config"]
