from .attention import AttentionInternals, MultiHeadSelfAttention, override_attention
from .classifier import ClassifierOutput, EncoderLayer, TransformerClassifier

__all__ = ["AttentionInternals", "ClassifierOutput", "EncoderLayer", "MultiHeadSelfAttention", "TransformerClassifier",
           "override_attention"]
