"""A Hugging Face classifier analysed as it is: its own head, no training, no Lightning checkpoint (docs/pretrained.md).

:func:`load_hf_classifier` reads a hub id or a ``save_pretrained`` folder and returns ``(model, tokenizer)``:

- a checkpoint saved as ``*ForSequenceClassification`` becomes a :class:`CheckpointClassifier`: the whole
  transformers model (encoder, pooler, classifier, ``id2label``) makes the prediction, so its logits are the
  checkpoint's own, and the diagnostics read the encoder's heads through the family adapter as for
  ``model=pretrained``;
- a bare encoder (``AutoModel`` only) becomes an :class:`EncoderOnly`: identifiability, effective attention,
  key-aware counts and the maps work; it makes no prediction, so asking it for logits (faithfulness,
  adversarial search) ends with one line saying why. A checkpoint whose head is of another task
  (``*ForTokenClassification``, ``*ForMaskedLM``, ...) is read the same way, its head left out with a warning.

Both are :class:`~.encoder.PretrainedClassifier` s (same views, ``attention_internals``, ``override_attention``),
so every diagnostic that reads a ``model=pretrained`` model reads these.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from ..models.classifier import POOLINGS, ClassifierOutput, pool
from .adapters import ATTENTION, Family, family_for, register_attention
from .encoder import PretrainedClassifier

log = logging.getLogger(__name__)

# Each family's task head, from the encoder's last hidden state y (B, T', d; after any final norm) and its mask to the
# logits, as its *ForSequenceClassification.forward computes them (dropout is the identity in eval mode). Every head
# but ModernBERT's mean pooling reads the first token alone, so T' may be 1. Tests: each against the whole model.
_TASK_HEADS = {  # task model t, last hidden state y, its mask, the head's pooling
    "bert": lambda t, y, mask, pooling: t.classifier(t.dropout(t.base_model.pooler(y))),
    "roberta": lambda t, y, mask, pooling: t.classifier(y),  # RobertaClassificationHead reads y[:, 0]
    "electra": lambda t, y, mask, pooling: t.classifier(y),  # ElectraClassificationHead too
    "distilbert": lambda t, y, mask, pooling: t.classifier(t.dropout(torch.relu(t.pre_classifier(y[:, 0])))),
    "deberta-v2": lambda t, y, mask, pooling: t.classifier(t.dropout(t.pooler(y))),  # ContextPooler reads y[:, 0]
    "modernbert": lambda t, y, mask, pooling: t.classifier(t.drop(t.head(pool(y, mask, pooling)))),
}


class CheckpointClassifier(PretrainedClassifier):
    """``task`` (a transformers ``*ForSequenceClassification`` built with ``attn_implementation=ATTENTION``),
    read like :class:`PretrainedClassifier`; its own head (pooler, dropout, classifier) turns the last hidden state
    into logits. ``pooling`` says which query row that head reads (the first token for BERT, RoBERTa, DistilBERT,
    ELECTRA and DeBERTa heads; ``config.classifier_pooling`` where the family has one)."""

    def __init__(self, task: nn.Module, family: Family, pad_id: int | None = None, max_len: int | None = None):
        nn.Module.__init__(self)
        if getattr(task.config, "_attn_implementation", None) != ATTENTION:
            raise ValueError(f"the model must be built with attn_implementation={ATTENTION!r}")
        task.train()  # as PretrainedClassifier: Lightning keeps the modes it finds; the diagnostics set eval
        self.task, self.family = task, family
        pooling = str(getattr(task.config, "classifier_pooling", "cls"))
        self.pooling = pooling if pooling in POOLINGS else "cls"
        self._read_encoder(self.encoder, pad_id, max_len)
        id2label = getattr(task.config, "id2label", None) or {}
        self.label_names = [str(id2label.get(i, id2label.get(str(i), i))) for i in range(task.config.num_labels)]

    @property
    def encoder(self) -> nn.Module:
        """The transformers encoder inside the task model (``base_model``: ``bert``, ``roberta``, ...)."""
        return self.task.base_model

    @property
    def num_classes(self) -> int:
        return int(self.task.config.num_labels)

    @property
    def logits_from_last_layer(self):
        """``f(y, mask) -> logits`` from the last layer's output (the family's final norm, then the checkpoint's own
        head: ``_TASK_HEADS``), what the adversarial search runs per candidate instead of the whole model; None for
        a family whose head is not known here (the search then runs whole forward passes)."""
        head = _TASK_HEADS.get(self.family.name)
        if head is None:
            return None
        return lambda y, mask: head(self.task, self._last_hidden_state(y), mask, self.pooling)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_attentions: bool = False, *, placed: dict | None = None) -> ClassifierOutput:
        mask = self._mask(input_ids, attention_mask)
        last: list[torch.Tensor] = []  # the encoder's last hidden state, on its way into the head
        hook = self.encoder.register_forward_hook(lambda _m, _args, out: last.append(out[0]))
        if output_attentions:
            self._state.weights = [None] * self.num_layers
        self._state.key_mask = mask
        try:
            logits = self.task(**self._model_inputs(input_ids, mask, placed)).logits
            weights = tuple(self._state.weights) if output_attentions else None
        finally:
            hook.remove()
            self._state.key_mask, self._state.weights = None, None
        return ClassifierOutput(logits=logits, attentions=weights, hidden_states=last[0])


class EncoderOnly(PretrainedClassifier):
    """A bare encoder (no task head) read like :class:`PretrainedClassifier`: its heads, maps and internals, but
    no prediction. ``forward`` refuses with :attr:`no_head` (the faithfulness suite and the adversarial search
    explain a prediction)."""

    has_head = False
    logits_from_last_layer = None

    def __init__(self, encoder: nn.Module, family: Family, name: str, pooling: str = "cls",
                 pad_id: int | None = None, max_len: int | None = None, left_out: str | None = None):
        nn.Module.__init__(self)
        if getattr(encoder.config, "_attn_implementation", None) != ATTENTION:
            raise ValueError(f"the encoder must be built with attn_implementation={ATTENTION!r}")
        self.encoder, self.family, self.pooling, self.name = encoder, family, pooling, name
        self.left_out = left_out  # the checkpoint's head of another task (BertForTokenClassification), not loaded
        self._read_encoder(encoder, pad_id, max_len)
        self.label_names = None

    @property
    def why_no_prediction(self) -> str:
        """Why the model makes no prediction, as a report says it."""
        if self.left_out:
            return (f"the checkpoint's head is a {self.left_out}, of another task than sentence classification; it "
                    "was left out and the encoder is read alone")
        return "the model is an encoder without a classification head"

    @property
    def no_head(self) -> str:
        what = (f"{self.name} has a {self.left_out} head, of another task (left out: only a "
                "*ForSequenceClassification head makes a sentence prediction)" if self.left_out else
                f"{self.name} is a bare encoder (saved without a *ForSequenceClassification head)")
        return (f"{what}: it makes no prediction, so there is nothing for the faithfulness explainers or the "
                "adversarial search to explain; its attention identifiability and maps work (analyze.py with "
                "text=... or texts_file=...), or fine-tune a head first (train.py model=pretrained)")

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_attentions: bool = False, *, placed: dict | None = None) -> ClassifierOutput:
        raise ValueError(self.no_head)


def load_hf_classifier(name_or_path: str, *, pooling: str | None = None, max_len: int | None = None,
                       score_special_tokens: bool = False, what: str = "hf_model"
                       ) -> tuple[PretrainedClassifier, object]:
    """``(model, tokenizer)`` for a hub id or a ``save_pretrained`` folder, in eval mode, with no training.

    ``model`` is a :class:`CheckpointClassifier` when the checkpoint was saved as a ``*ForSequenceClassification``
    (``model(input_ids, attention_mask).logits`` are the checkpoint's own; ``model.label_names`` its ``id2label``),
    else an :class:`EncoderOnly`; both take every diagnostic of the project. ``tokenizer`` is the checkpoint's
    transformers fast tokenizer; the model derives pair inputs' ``token_type_ids`` from its separator, and its
    explainers leave the special tokens ([CLS], [SEP], <s>, </s>) unscored and never erase them, unless
    ``score_special_tokens``.
    ``pooling`` (bare encoders only: a classification head pools as it was trained) overrides the pooling the
    checkpoint declares (a sentence-transformers ``modules.json``), else the first token. ``what`` names the
    setting in error messages.
    """
    from . import loading as hf_loading

    register_attention()
    if hf_loading.is_local(name_or_path):
        hf_loading.check_folder(name_or_path, what, weights=True)
    config = hf_loading.load_config(name_or_path, what)
    family = family_for(config, f"{what}={name_or_path}")
    tokenizer = hf_loading.load_tokenizer(name_or_path, what)
    pad_id = tokenizer.pad_token_id
    if hf_loading.has_classification_head(config):
        if pooling is not None:
            log.warning("%s=%s has its own classification head, which pools as it was trained: pooling=%s is not "
                        "used", what, name_or_path, pooling)
        task = hf_loading.load_sequence_classifier(name_or_path, what, attn_implementation=ATTENTION)
        model: PretrainedClassifier = CheckpointClassifier(task, family, pad_id=pad_id, max_len=max_len)
    else:
        if pooling is None:
            pooling = hf_loading.declared_pooling(name_or_path) or "cls"
        if pooling not in POOLINGS:
            raise ValueError(f"pooling={pooling!r} is unknown; use one of {list(POOLINGS)}")
        left_out = hf_loading.head_of_another_task(config)
        if left_out:
            log.warning("%s=%s has a %s head, of another task than sentence classification: it is left out and the "
                        "encoder is read alone (identifiability and maps; no prediction)", what, name_or_path, left_out)
        encoder = hf_loading.load_weights(name_or_path, what, attn_implementation=ATTENTION)
        model = EncoderOnly(encoder, family, f"{what}={name_or_path}", pooling=pooling, pad_id=pad_id,
                            max_len=max_len, left_out=left_out)
    model.set_tokenizer(tokenizer.backend_tokenizer, score_special_tokens)
    return model.eval(), tokenizer


def build_checkpoint_classifier(name_or_path: str, num_classes: int, *, pad_id: int | None = None,
                                max_len: int | None = None, hf_config: dict | None = None,
                                what: str = "model.name_or_path") -> CheckpointClassifier:
    """``model.keep_head=true``: the checkpoint's own ``*ForSequenceClassification`` head (pooler, classifier),
    to fine-tune further; with ``hf_config`` (a saved ``config.to_dict()``) fresh weights of that configuration
    (a Lightning checkpoint's own are loaded next). ``num_classes`` must be the head's number of labels."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from . import loading as hf_loading

    register_attention()
    if hf_config is not None:
        config_dict = dict(hf_config)
        config = AutoConfig.for_model(config_dict.pop("model_type"), **config_dict)
    else:
        if hf_loading.is_local(name_or_path):
            hf_loading.check_folder(name_or_path, what, weights=True)
        config = hf_loading.load_config(name_or_path, what)
    family = family_for(config, f"{what}={name_or_path}")
    if not hf_loading.has_classification_head(config):
        raise ValueError(f"model.keep_head=true but {what}={name_or_path} has no classification head (its "
                         f"architectures are {getattr(config, 'architectures', None)}): set model.keep_head=false for "
                         "a fresh head, or pass a *ForSequenceClassification checkpoint")
    if int(config.num_labels) != int(num_classes):
        raise ValueError(f"model.keep_head=true but {what}={name_or_path}'s head has {config.num_labels} labels and "
                         f"the data {num_classes} classes: set model.keep_head=false for a fresh head of the data's "
                         "classes")
    if hf_config is not None or torch.empty(0).device.type == "meta":
        task = AutoModelForSequenceClassification.from_config(config, attn_implementation=ATTENTION)
    else:
        task = hf_loading.load_sequence_classifier(name_or_path, what, attn_implementation=ATTENTION)
    return CheckpointClassifier(task, family, pad_id=pad_id, max_len=max_len)
