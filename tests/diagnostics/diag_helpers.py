"""The tiny data module and Lightning module that the callback tests fit: one home for all of them."""

from __future__ import annotations

import datasets
import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from torch.utils.data import DataLoader

from identifiable_transformers.models import TransformerClassifier

VOCAB = 60  # ids 3..59 are words; 0 <pad>, 1 <unk>, 2 <cls>


def word_tokenizer() -> Tokenizer:
    vocab = {"<pad>": 0, "<unk>": 1, "<cls>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    return Tokenizer(WordLevel(vocab, unk_token="<unk>"))


class TinyData(pl.LightningDataModule):
    """Rows {input_ids, labels[, rationale]} as datasets, padded per batch of 16; the attributes the callbacks read
    (tokenizer, has_rationales, max_length) are set as given."""

    def __init__(self, train_rows: list[dict], val_rows: list[dict], tokenizer: Tokenizer | None = None,
                 has_rationales: bool = False, max_length: int | None = None):
        super().__init__()
        self.tokenizer, self.has_rationales = tokenizer, has_rationales
        if max_length is not None:
            self.max_length = max_length
        self.train_dataset = datasets.Dataset.from_list(train_rows)
        self.val_dataset = datasets.Dataset.from_list(val_rows)

    def collate(self, rows):
        T = max(len(r["input_ids"]) for r in rows)
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r["input_ids"])] = torch.tensor(r["input_ids"])
        return {"input_ids": ids, "attention_mask": ids != 0, "labels": torch.tensor([r["labels"] for r in rows])}

    def train_dataloader(self):
        return DataLoader(list(self.train_dataset), batch_size=16, collate_fn=self.collate)

    def val_dataloader(self):
        return DataLoader(list(self.val_dataset), batch_size=16, collate_fn=self.collate)


class TinyModule(pl.LightningModule):
    """Cross-entropy training of ``model`` (default: a 1-layer d = 16, 4-head TransformerClassifier over VOCAB);
    validation logs ``val/loss``."""

    def __init__(self, model: torch.nn.Module | None = None, **model_kwargs):
        super().__init__()
        self.model = model if model is not None else TransformerClassifier(
            VOCAB, 2, **{"embed_dim": 16, "num_heads": 4, "key_dim": 2, "max_len": 64, **model_kwargs})

    def _loss(self, batch):
        return F.cross_entropy(self.model(batch["input_ids"], batch["attention_mask"]).logits, batch["labels"])

    def training_step(self, batch, batch_idx):
        return self._loss(batch)

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self._loss(batch), batch_size=batch["labels"].shape[0])

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def random_model(head_combine="concat", pooling="cls", positional="none", layers=1, seed=0, norm_first=False):
    """A small random encoder (eval mode). One layer with cls pooling takes the faithfulness one-layer shortcut;
    more layers or mean pooling do not."""
    torch.manual_seed(seed)
    return TransformerClassifier(30, 3, embed_dim=8, num_heads=2, key_dim=2, head_combine=head_combine, ffn_dim=16,
                                 num_layers=layers, pooling=pooling, positional=positional, dropout=0.1,
                                 norm_first=norm_first).eval()


def random_batch(B=5, T=9, seed=0):
    """Random ids for random_model, <cls> first, lengths T, T - 1, 5, 3, 2 (right padding)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 30, (B, T), generator=g)
    ids[:, 0] = 2  # <cls>
    lengths = torch.tensor([T, T - 1, 5, 3, 2][:B])
    mask = torch.arange(T) < lengths[:, None]
    return ids.masked_fill(~mask, 0), mask
