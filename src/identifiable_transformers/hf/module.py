"""LightningModule fine-tuning a pretrained Hugging Face encoder (``model=pretrained``, docs/pretrained.md).

``PretrainedTextClassifier`` is a :class:`~.lit_module.ClassifierModule`, as ``TextClassifier`` is (same loss,
metrics, optimiser, schedules, exact resume and checkpoint checks), whose ``model`` is a
:class:`~.models.pretrained.PretrainedClassifier`. The encoder's configuration is saved in the hyper-parameters
(``hf_config``), so ``load_from_checkpoint`` rebuilds the model from the checkpoint alone: no hub, no folder.
"""

from __future__ import annotations

from tokenizers import Tokenizer

from ..modules.classifier import ClassifierModule
from .encoder import build_pretrained_classifier
from .sequence_classifier import build_checkpoint_classifier


def _reads_pairs(data_cfg: dict | None) -> bool:
    """Whether the data module encodes sentence pairs (``PretrainedTextDataModule.pairs``: two text fields, not the
    classic CSV layout): only then does a [SEP] start a second segment; a single text holding [SEP] keeps token
    type 0 throughout, as the tokenizer gives it. Without the data's settings, pairs (the rule before this one)."""
    if not data_cfg:
        return True
    fields = data_cfg.get("text_fields") or ["text"]
    return len([fields] if isinstance(fields, str) else fields) == 2 and not data_cfg.get("data_dir")


class PretrainedTextClassifier(ClassifierModule):
    def __init__(
        self,
        name_or_path: str,
        num_classes: int,
        pooling: str | None = "cls",  # null: the checkpoint's declared pooling (sentence-transformers), else cls
        dropout: float | None = 0.1,  # on the pooled vector; null: the encoder's hidden dropout
        max_len: int | None = None,  # the longest input (data.max_length); at most the encoder's positions
        # optimisation (as TextClassifier)
        lr: float = 2e-5,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        scheduler: str = "linear",
        label_smoothing: float = 0.0,
        # from the data module, as for TextClassifier
        vocab_size: int | None = None,
        pad_id: int | None = None,
        label_names: list[str] | None = None,
        tokenizer_json: str | None = None,
        data_cfg: dict | None = None,
        keep_head: bool = False,  # the checkpoint's own *ForSequenceClassification head instead of a fresh one
        score_special_tokens: bool = False,  # faithfulness: score and erase [CLS]/[SEP]/<s>/</s> too
        # written by the module itself: the encoder's config, so a checkpoint rebuilds it without the hub
        hf_config: dict | None = None,
    ):
        args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}  # before any other local
        super().__init__(num_classes, lr, weight_decay, warmup_steps, scheduler, label_smoothing, label_names)
        self.save_hyperparameters(args, logger=False)
        if keep_head:
            self.model = build_checkpoint_classifier(name_or_path, num_classes, pad_id=pad_id, max_len=max_len,
                                                     hf_config=hf_config)
        else:
            self.model = build_pretrained_classifier(name_or_path, num_classes, pooling=pooling, dropout=dropout,
                                                     pad_id=pad_id, max_len=max_len, hf_config=hf_config)
        if tokenizer_json:
            self.model.set_tokenizer(Tokenizer.from_str(tokenizer_json), score_special_tokens,
                                     pairs=_reads_pairs(data_cfg))
        config = self.model.encoder.config
        rows = self.model.token_embedding.num_embeddings
        if vocab_size is not None and vocab_size > rows:
            raise ValueError(f"the tokenizer has {vocab_size} tokens but {name_or_path}'s embeddings only {rows}: the "
                             "data was tokenized with another model's tokenizer (data.pretrained_tokenizer must be "
                             "model.name_or_path, as model=pretrained sets it)")
        if pad_id is not None and config.model_type in ("roberta", "xlm-roberta") and pad_id != config.pad_token_id:
            raise ValueError(f"the tokenizer pads with id {pad_id} but {name_or_path} numbers its positions from "
                             f"pad_token_id={config.pad_token_id}: use the checkpoint's own tokenizer")
        if hf_config is None:
            self.hparams["hf_config"] = config.to_dict()
            self.hparams["pooling"] = self.model.pooling  # as resolved: a rebuild reads no modules.json

    @property
    def architecture(self) -> dict:
        """The encoder's shape, in the model settings metrics.json records (the report groups runs by these)."""
        m = self.model
        return {"model_type": m.encoder.config.model_type, "embed_dim": m.embed_dim, "num_heads": m.num_heads,
                "key_dim": m.key_dim, "value_dim": m.value_dim, "head_combine": m.head_combine,
                "num_layers": m.num_layers}
