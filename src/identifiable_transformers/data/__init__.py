"""Data layer: named datasets, word-level tokenizer, Lightning DataModule."""

from .datamodule import EpochShuffleSampler, LengthBucketSampler, TextDataModule
from .registry import CLASSIC_DATASETS, KNOWN_DATASETS, get_spec, known_names
from .sources import DataUnavailableError, package_csv_path
from .tokenizer import (
    CLS_ID,
    PAD_ID,
    SEP_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    encode_texts,
    load_tokenizer,
    save_tokenizer,
    tokenizer_from_str,
    train_tokenizer,
)

__all__ = [
    "TextDataModule", "EpochShuffleSampler", "LengthBucketSampler", "KNOWN_DATASETS", "CLASSIC_DATASETS",
    "get_spec", "known_names",
    "DataUnavailableError", "package_csv_path", "encode_texts", "load_tokenizer", "save_tokenizer",
    "tokenizer_from_str", "train_tokenizer", "SPECIAL_TOKENS", "PAD_ID", "UNK_ID", "CLS_ID", "SEP_ID",
]
