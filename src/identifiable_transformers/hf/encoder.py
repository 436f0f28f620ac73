"""A pretrained Hugging Face encoder with a linear classification head, read like a TransformerClassifier.

``PretrainedClassifier`` wraps ``AutoModel`` (BERT, RoBERTa, DistilBERT, MiniLM, ELECTRA, DeBERTa-v2/v3, ModernBERT:
the families of adapters.py) and exposes what the project's diagnostics consume from its own encoders: ``forward`` ->
``ClassifierOutput``, ``attention_internals`` (each layer's weights, values and per-head output projections,
``AttentionInternals``), ``override_attention`` (hooks on every layer's weights), ``token_embedding``,
``layers[i].attn.q_proj / k_proj`` (the key-aware count's hooks) and the configuration attributes
(``embed_dim``, ``num_heads``, ``key_dim``, ``value_dim``, ``head_combine = "concat"``, ``num_layers``,
``max_len``, ``pooling``, ``pad_id``). A layer's head h contributes ``A_h (X W_v^h + b_v^h) W_o^h`` to its
attention output (before the output bias, dropout, residual and LayerNorm), with W_o^h the rows
h d_h .. (h+1) d_h of the output projection's input: that is the T = V W_o^h of docs/identifiability.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import torch
from tokenizers import Tokenizer
from torch import nn

from ..models.attention import AttentionInternals
from ..models.classifier import POOLINGS, ClassifierOutput, _check_choice, pool
from .adapters import ATTENTION, AttentionState, Family, family_for, register_attention
from .data import separator_id, special_token_ids


class PretrainedClassifier(nn.Module):
    """``encoder`` (a transformers ``PreTrainedModel`` built with ``attn_implementation=ATTENTION``) + dropout +
    linear head on the pooled last hidden state (``pooling``: the first token, or the mean over real tokens).

    Build it with :func:`build_pretrained_classifier` (hub id, folder or saved config). ``has_head``: whether it
    makes a prediction (a bare encoder read by ``load_hf_classifier`` does not).
    """

    has_head = True

    def __init__(self, encoder: nn.Module, family: Family, num_classes: int, pooling: str = "cls",
                 dropout: float | None = 0.1, pad_id: int | None = None, max_len: int | None = None):
        super().__init__()
        _check_choice("pooling", pooling, POOLINGS)
        config = encoder.config
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if getattr(config, "_attn_implementation", None) != ATTENTION:
            raise ValueError(f"the encoder must be built with attn_implementation={ATTENTION!r}")
        encoder.train()  # from_pretrained returns it in eval mode, and Lightning keeps the modes it finds
        self.encoder, self.family = encoder, family
        self.pooling = pooling
        self._read_encoder(encoder, pad_id, max_len)
        if getattr(encoder, "pooler", None) is not None:
            encoder.pooler = None  # the head reads the last hidden state; an unused pooler would get no gradient
        p = getattr(config, "hidden_dropout_prob", getattr(config, "dropout", 0.1)) if dropout is None else dropout
        self.dropout = nn.Dropout(p)
        self.head = nn.Linear(self.embed_dim, num_classes)
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def _read_encoder(self, encoder: nn.Module, pad_id: int | None, max_len: int | None) -> None:
        """The configuration attributes the diagnostics read, and the attention state shared with every layer."""
        config, family = encoder.config, self.family
        positions = family.max_tokens(config)
        if max_len is not None and max_len > positions:
            raise ValueError(
                f"max_len={max_len} is longer than the {positions} tokens this {config.model_type} model has "
                f"positions for: set it to {positions} or less")
        self.max_len = int(max_len or positions)
        self.pad_id = int(pad_id if pad_id is not None else (config.pad_token_id or 0))
        layers = family.layers(encoder)
        self.num_layers = len(layers)
        out = family.output(layers[0])
        self.embed_dim = out.out_features
        self.num_heads = int(getattr(config, "num_attention_heads", None) or config.n_heads)
        if out.in_features % self.num_heads:
            raise ValueError(f"the output projection's {out.in_features} inputs do not split into "
                             f"{self.num_heads} heads")
        self.key_dim = self.value_dim = out.in_features // self.num_heads
        self.head_combine = "concat"
        self.sep_id: int | None = None  # set for pair inputs: token types follow the first separator (token_types)
        self._separator: int | None = None  # the tokenizer's separator, whether or not the inputs are pairs
        # Token ids the faithfulness explainers neither score nor erase, like <cls> (the special tokens by default:
        # set_tokenizer); empty: every real token but the first is scored.
        self.pinned_ids: tuple[int, ...] = ()
        # Shared with every layer's attention module (hf_adapters.attention_forward reads it); plain attributes,
        # not submodules, so the state dict is exactly the encoder's and the head's.
        self._state = AttentionState()
        for i, layer in enumerate(layers):
            attn = family.attention(layer)
            attn._idt_state, attn._idt_layer = self._state, i
            if family.install is not None:  # a family outside AttentionInterface (DeBERTa): tap its softmax maps
                family.install(attn)

    def set_tokenizer(self, tokenizer: Tokenizer, score_special_tokens: bool = False, pairs: bool = True) -> None:
        """What the model reads from its tokenizer (a ``tokenizers.Tokenizer``): the separator that starts a pair's
        second segment (see :meth:`read_pairs`), and the special tokens explanations leave out (all scored with
        ``score_special_tokens``)."""
        self._separator = separator_id(tokenizer)
        self.pinned_ids = () if score_special_tokens else special_token_ids(tokenizer)
        self.read_pairs(pairs)

    def read_pairs(self, pairs: bool) -> None:
        """Whether the inputs are sentence pairs, whose second segment (token type 1) follows the first separator.
        The ids cannot tell: ``[CLS] a [SEP] b [SEP]`` is the pair (a, b) and also the one text ``"a [SEP] b"``, to
        which the tokenizer gives token types 0 throughout. With ``pairs=False`` every token has type 0."""
        self.sep_id = self._separator if pairs else None

    # ------------------------------------------------------------------------------------ views
    @property
    def token_embedding(self) -> nn.Embedding:
        """The word (token) embeddings: what gradient and integrated-gradients explainers attribute to."""
        return self.family.word_embeddings(self.encoder)

    @property
    def layers(self) -> list[SimpleNamespace]:
        """Per layer, ``attn.q_proj`` / ``attn.k_proj``: the model's query and key projections (not copies)."""
        return [SimpleNamespace(attn=SimpleNamespace(q_proj=self.family.query(l), k_proj=self.family.key(l)))
                for l in self.family.layers(self.encoder)]

    def head_out_proj(self, layer: int) -> torch.Tensor:
        """(H, d_h, d): W_o^h of every head of ``layer``, read from its output projection's weight."""
        w = self.family.output(self.family.layers(self.encoder)[layer]).weight  # (d, H d_h)
        return w.t().reshape(self.num_heads, self.value_dim, self.embed_dim)

    # ---------------------------------------------------------------------------------- forward
    def _mask(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.max_len:
            raise ValueError(f"input length {input_ids.shape[1]} exceeds max_len={self.max_len}: truncate the input "
                             "(data.max_length)")
        return input_ids != self.pad_id if attention_mask is None else attention_mask.bool()

    def token_types(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """(B, T) segment ids of a pair ``[CLS] a [SEP] b [SEP]``: 0 up to the first separator, 1 after it (as the
        tokenizer's pair encoding gives them), 0 on padding; None when the model has no segments (RoBERTa,
        DistilBERT) or ``sep_id`` is unset. Read from the ids, so erased tokens keep their segment."""
        if self.sep_id is None or int(getattr(self.encoder.config, "type_vocab_size", 0) or 0) < 2:
            return None
        sep = (input_ids == self.sep_id).long()
        return (((sep.cumsum(1) - sep) > 0) & mask).long()

    def _model_inputs(self, input_ids: torch.Tensor, mask: torch.Tensor, placed: dict | None = None) -> dict:
        """The encoder's keyword inputs; ``placed`` ({position_ids, token_type_ids}, from :meth:`kept_logits`)
        replaces the positions and segments the ids would get."""
        inputs = {"input_ids": input_ids, "attention_mask": mask.long()}
        types = self.token_types(input_ids, mask)
        if types is not None:
            inputs["token_type_ids"] = types
        return {**inputs, **(placed or {})}

    def _encode(self, input_ids: torch.Tensor, mask: torch.Tensor, placed: dict | None = None) -> torch.Tensor:
        self._state.key_mask = mask
        try:
            return self.encoder(**self._model_inputs(input_ids, mask, placed)).last_hidden_state
        finally:
            self._state.key_mask = None

    @property
    def keeps_positions(self) -> bool:
        """Whether :meth:`kept_logits` applies: absolute positions the encoder takes as ``position_ids``."""
        return self.family.positions is not None

    def kept_logits(self, input_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """Logits of each row of ``input_ids`` (S, T) seen through ``keep`` (S, T) bool (the first token kept):
        ``forward(input_ids, keep)``, run as the shorter sequence of the kept tokens at their own positions and
        segments. A dropped token is a masked key in every layer and the rest of a layer works token by token, so
        the kept tokens' outputs are the same, at the cost of the kept tokens only (erasure's copies:
        diagnostics/faithfulness/readout.py). Only where :attr:`keeps_positions` (absolute positions)."""
        if not self.keeps_positions:
            raise ValueError(f"{self.family.name} models do not take absolute position ids: run forward(ids, keep)")
        positions = self.family.positions(self.encoder.config, input_ids.shape[1], input_ids.device)  # (T,)
        types = self.token_types(input_ids, torch.ones_like(keep))  # from the whole row: dropped tokens count
        n = keep.sum(1)
        idx = keep.to(torch.int8).argsort(dim=1, descending=True, stable=True)[:, : int(n.max())]  # kept ones, in order
        mask = torch.arange(idx.shape[1], device=keep.device) < n[:, None]
        placed = {"position_ids": positions[idx]}
        if types is not None:
            placed["token_type_ids"] = types.gather(1, idx) * mask
        return self(input_ids.gather(1, idx).masked_fill(~mask, self.pad_id), mask, placed=placed).logits

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                output_attentions: bool = False, *, placed: dict | None = None) -> ClassifierOutput:
        mask = self._mask(input_ids, attention_mask)
        if output_attentions:
            self._state.weights = [None] * self.num_layers
        try:
            x = self._encode(input_ids, mask, placed)  # (B, T, d)
            weights = tuple(self._state.weights) if output_attentions else None
        finally:
            self._state.weights = None
        return ClassifierOutput(logits=self._classify(x, mask), attentions=weights, hidden_states=x)

    def _classify(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The head on the pooled last hidden state (after any final norm)."""
        return self.head(self.dropout(pool(hidden, mask, self.pooling)))

    def logits_from_last_layer(self, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Logits from the last layer's output y (B, T', d) and its mask (B, T'): the family's final norm, pooling
        and the head, as ``forward`` does after the layers. With cls pooling T' may be 1 (only the first token is
        read)."""
        return self._classify(self._last_hidden_state(y), mask)

    def _last_hidden_state(self, y: torch.Tensor) -> torch.Tensor:
        """The encoder's last hidden state from the last layer's output: the family's final norm (ModernBERT's;
        none for the others)."""
        norm = self.family.final_norm(self.encoder)
        return y if norm is None else norm(y)

    def attention_internals(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                            ) -> list[AttentionInternals]:
        """Per layer: the model's own attention weights, values (with bias) and per-head output maps.

        Call under ``torch.no_grad()`` in eval mode for the deterministic quantities the diagnostics analyse.
        """
        mask = self._mask(input_ids, attention_mask)
        self._state.capture, self._state.record = True, {}
        try:
            self._encode(input_ids, mask)
            record = self._state.record
        finally:
            self._state.capture, self._state.record = False, {}
        out = []
        for l in range(self.num_layers):
            weights, values = record[l]
            w_o = self.head_out_proj(l)
            head_output = torch.einsum("bhst,bhtv,hvd->bhsd", weights, values, w_o)
            out.append(AttentionInternals(attention=weights, values=values, out_proj=w_o, head_output=head_output))
        return out

    def encoder_blocks(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> list:
        """Per layer, its input, attention internals, norms and the rest of the layer (hf/blocks.py): what the
        context-mixing explainers read. Call under ``torch.no_grad()`` in eval mode."""
        from .blocks import encoder_blocks

        return encoder_blocks(self, input_ids, attention_mask)

    def context_mixing_unsupported(self) -> str | None:
        """Why the context-mixing explainers cannot read this model's layers (hf/blocks.py), or None."""
        from .blocks import context_mixing_unsupported

        return context_mixing_unsupported(self)

    @contextmanager
    def override_attention(self, hook: Callable[[int, torch.Tensor, torch.Tensor | None], torch.Tensor]
                           ) -> Iterator[None]:
        """``models.override_attention`` for this model: ``hook(layer, weights, key_mask)`` replaces every
        layer's softmax weights before dropout and the product with the values."""
        self._state.hook = hook
        try:
            yield
        finally:
            self._state.hook = None


def build_pretrained_classifier(name_or_path: str, num_classes: int, *, pooling: str | None = "cls",
                                dropout: float | None = 0.1, pad_id: int | None = None, max_len: int | None = None,
                                hf_config: dict | None = None, what: str = "model.name_or_path"
                                ) -> PretrainedClassifier:
    """The classifier around ``name_or_path``'s pretrained encoder (its weights), or, with ``hf_config`` (a saved
    ``config.to_dict()``), around an encoder of that configuration with fresh weights (a checkpoint's own
    weights are loaded next). On the ``meta`` device only the configuration is read (config checks).

    ``pooling`` None: the pooling the checkpoint declares (a sentence-transformers ``modules.json``), else "cls".
    (The checkpoint's own head instead of a fresh one: ``sequence_classifier.build_checkpoint_classifier``.)
    """
    from transformers import AutoConfig, AutoModel

    from . import loading as hf_loading

    register_attention()
    if hf_config is None and hf_loading.is_local(name_or_path):
        hf_loading.check_folder(name_or_path, what, weights=True)  # also in the config checks: before any data
    if hf_config is not None:
        config_dict = dict(hf_config)
        model_type = config_dict.pop("model_type", None)
        if model_type is None:
            raise ValueError(f"hf_config has no model_type: it is not a saved transformers config ({what})")
        config = AutoConfig.for_model(model_type, **config_dict)
    else:
        config = hf_loading.load_config(name_or_path, what)
    family = family_for(config, f"{what}={name_or_path}")
    positions = family.max_tokens(config)
    if max_len is not None and max_len > positions:
        raise ValueError(f"max_len={max_len} is longer than the {positions} tokens {name_or_path} has positions "
                         f"for: set it to {positions} or less")
    meta = torch.empty(0).device.type == "meta"
    if pooling is None:
        pooling = (None if hf_config is not None else hf_loading.declared_pooling(name_or_path)) or "cls"
    if hf_config is not None or meta:
        encoder = AutoModel.from_config(config, attn_implementation=ATTENTION)
    else:
        encoder = hf_loading.load_weights(name_or_path, what, attn_implementation=ATTENTION)
    return PretrainedClassifier(encoder, family, num_classes, pooling=pooling, dropout=dropout, pad_id=pad_id,
                                max_len=max_len)

