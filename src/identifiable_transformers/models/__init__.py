from .attention import AttentionInternals, MultiHeadSelfAttention
from .classifier import ClassifierOutput, EncoderLayer, TransformerClassifier

__all__ = ["AttentionInternals", "ClassifierOutput", "EncoderLayer", "MultiHeadSelfAttention", "TransformerClassifier"]
