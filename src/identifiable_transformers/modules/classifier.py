"""LightningModules: ``ClassifierModule`` (loss, metrics, optimiser, exact resume) and ``TextClassifier``, which
builds the project's TransformerClassifier in it.

All constructor arguments are primitives and saved as hyper-parameters, so
``TextClassifier.load_from_checkpoint(path)`` rebuilds the model, its tokenizer and label names
without Hydra. The tokenizer is stored there once (``tokenizer_json``), not again in the data
module's state.
"""

from __future__ import annotations

import inspect
import io
import math
import random
import warnings
from functools import cached_property

import lightning.pytorch as pl
import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision
from torchmetrics import MaxMetric, MetricCollection

from ..models import TransformerClassifier
from .checkpoint import CheckpointError, read_checkpoint
from .metrics import IGNORE_INDEX, Accuracy, F1Score, WeightedMean

SCHEDULERS = ("constant", "linear", "cosine")
_FUSED_ADAMW_DEVICES = ("cpu", "cuda", "mps", "xpu")
_MODEL_ARGS = set(inspect.signature(TransformerClassifier).parameters)
# model.cuda_graphs: where the training step is captured, and how (tests put the CPU and the eager backend here).
_GRAPH_DEVICES = ("cuda",)
_GRAPH_COMPILE = {"mode": "reduce-overhead", "fullgraph": True, "dynamic": False}


# numpy's RNG state as tensors and ints, so checkpoints stay loadable with torch.load(weights_only=True).
def _numpy_state_to_tensors(state: tuple) -> tuple:
    name, keys, pos, has_gauss, cached = state
    return name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)


def _numpy_state_from_tensors(state: tuple) -> tuple:
    name, keys, pos, has_gauss, cached = state
    return name, keys.numpy().astype(np.uint32), pos, has_gauss, cached


def _compile_in_place(model: torch.nn.Module) -> None:
    """torch.compile ``model``'s forward in place (its parameter names, hence checkpoints, stay the same)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as err:
        raise RuntimeError(
            f"model.compile=true needs a C++ compiler for torch.compile, and none was found ({err}). "
            "Install one (e.g. g++) or set model.compile=false."
        ) from None
    model.compile()


def check_training_args(num_classes: int, lr: float, weight_decay: float, warmup_steps: int, scheduler: str,
                        label_smoothing: float, label_names: list[str] | None) -> None:
    """The optimisation and label arguments every classifier module takes (ValueError naming the argument)."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler={scheduler!r} is unknown; use one of {list(SCHEDULERS)}")
    for name, value in (("lr", lr), ("weight_decay", weight_decay), ("warmup_steps", warmup_steps)):
        if value < 0:  # lr=0 is allowed: a frozen run is a useful baseline
            raise ValueError(f"{name} must be >= 0, got {value}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if label_names is not None and len(label_names) != num_classes:
        raise ValueError(f"label_names has {len(label_names)} names but num_classes={num_classes}")


class ClassifierModule(pl.LightningModule):
    """Loss, sync-free metrics, optimiser and schedules, exact resume and checkpoint checks around ``self.model``, a
    classifier that each subclass builds after ``super().__init__`` and its own ``save_hyperparameters`` (so that a
    checkpoint holds that subclass's arguments only): :class:`TextClassifier` (the project's encoder) and
    :class:`~.pretrained_module.PretrainedTextClassifier` (a Hugging Face encoder)."""

    def __init__(self, num_classes: int, lr: float, weight_decay: float, warmup_steps: int, scheduler: str,
                 label_smoothing: float, label_names: list[str] | None):
        super().__init__()
        check_training_args(num_classes, lr, weight_decay, warmup_steps, scheduler, label_smoothing, label_names)
        self._init_metrics(num_classes)

    def _init_metrics(self, num_classes: int) -> None:
        """The stage metrics, and the state of model.cuda_graphs."""
        self._graphed_loss = None  # model.cuda_graphs on CUDA: the compiled _forward_loss (on_fit_start)
        # Paper-style accuracy is micro-averaged; torchmetrics' default would average per class. Both count
        # without host synchronisation and leave out the padding rows of a fixed-size batch (metrics.py).
        metrics = MetricCollection({"acc": Accuracy(num_classes, average="micro"),
                                    "f1": F1Score(num_classes, average="macro")})
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        # train/loss_epoch, weighted by the real rows; Lightning's own running means are not checkpointed.
        self.train_loss = WeightedMean()
        self.val_acc_best = MaxMetric()
        # Checkpointed, so that a run resumed mid-epoch reports the same epoch metrics and best accuracy.
        for metric in (self.train_metrics, self.train_loss, self.val_acc_best):
            metric.persistent(True)

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path, map_location=None, hparams_file=None, strict=None, **kwargs):
        """Lightning's ``load_from_checkpoint`` on a file that :func:`read_checkpoint` has checked
        (its checksum, that it is a checkpoint of this project), read once and loaded with
        ``weights_only=True``: a checkpoint never names code to run."""
        ckpt, data = read_checkpoint(checkpoint_path)
        if cls is TextClassifier and "name_or_path" in (ckpt.get("hyper_parameters") or {}):
            raise CheckpointError(f"{checkpoint_path} holds a pretrained Hugging Face encoder (model=pretrained): "
                                  "load it with identifiable_transformers.loading.load_module(path)")
        kwargs["weights_only"] = True
        return super().load_from_checkpoint(io.BytesIO(data), map_location, hparams_file, strict, **kwargs)

    @property
    def label_names(self) -> list[str]:
        return self.hparams.label_names or [str(i) for i in range(self.hparams.num_classes)]

    @cached_property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` the model was trained with (None if none was saved)."""
        if self.hparams.tokenizer_json is None:
            return None
        from tokenizers import Tokenizer

        return Tokenizer.from_str(self.hparams.tokenizer_json)

    def forward(self, input_ids, attention_mask=None, output_attentions=False):
        return self.model(input_ids, attention_mask, output_attentions)

    def _forward_loss(self, input_ids, attention_mask, labels, label_smoothing: float):
        """Logits and the mean cross-entropy over the rows whose label is not IGNORE_INDEX (a fixed-size batch's
        padding rows): what model.cuda_graphs captures."""
        logits = self.model(input_ids, attention_mask).logits
        return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing), logits

    def on_fit_start(self) -> None:
        """model.cuda_graphs: compile the training forward (and so its backward) with CUDA graphs. On another
        device it is ignored with a warning, so that one config serves a GPU node and a laptop."""
        if not self.hparams.get("cuda_graphs") or self._graphed_loss is not None:
            return
        if self.device.type not in _GRAPH_DEVICES:
            warnings.warn(f"model.cuda_graphs=true has no effect on {self.device.type}: the training step runs "
                          "eagerly (CUDA graphs need a CUDA device)", stacklevel=2)
            return
        if self.trainer.accumulate_grad_batches > 1:
            # A replay overwrites the previous one's outputs, the gradients being accumulated among them.
            raise ValueError(f"model.cuda_graphs=true cannot accumulate gradients (trainer.accumulate_grad_batches="
                             f"{self.trainer.accumulate_grad_batches}): set it to 1, or model.cuda_graphs=false")
        self._graphed_loss = torch.compile(self._forward_loss, **_GRAPH_COMPILE)

    def _step(self, batch: dict, stage: str) -> torch.Tensor:
        labels = batch["labels"]
        smoothing = self.hparams.label_smoothing if stage == "train" else 0.0
        if stage == "train" and self._graphed_loss is not None and self.training:
            torch.compiler.cudagraph_mark_step_begin()
            loss, logits = self._graphed_loss(batch["input_ids"], batch["attention_mask"], labels, smoothing)
            loss, logits = loss.clone(), logits.clone()  # the graph's outputs are overwritten by its next replay
        else:
            loss, logits = self._forward_loss(batch["input_ids"], batch["attention_mask"], labels, smoothing)
        metrics = getattr(self, f"{stage}_metrics")
        metrics.update(logits, labels)
        size = labels.shape[0]
        if stage == "train":
            # weighted by the real rows (a tensor: counting them on the host would wait for the device)
            self.train_loss.update(loss.detach(), (labels != IGNORE_INDEX).sum())
            self.log("train/loss_step", loss, prog_bar=True, batch_size=size)
            self.log("train/loss_epoch", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        else:
            self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=True, batch_size=size, sync_dist=True)
        self.log_dict(metrics, on_step=False, on_epoch=True, prog_bar=stage != "train", batch_size=size)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, "val")

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def predict_step(self, batch, batch_idx):
        return self.model(batch["input_ids"], batch["attention_mask"]).logits

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:  # must not count towards the best validation accuracy
            return
        self.val_acc_best(self.val_metrics["acc"].compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    # Lightning does not checkpoint the random state: without it a resumed run draws other dropout masks.
    # Under DDP every rank has its own stream: the checkpoint keeps a list, one state per rank.
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        state = {
            "torch": torch.get_rng_state(),
            "numpy": _numpy_state_to_tensors(np.random.get_state()),
            "python": random.getstate(),
            **({"cuda": torch.cuda.get_rng_state_all()} if torch.cuda.is_available() else {}),
        }
        states = [state] * self.trainer.world_size
        if self.trainer.world_size > 1:  # Trainer.save_checkpoint runs on every rank, so this collective is safe
            torch.distributed.all_gather_object(states, state)
        checkpoint["rng_states"] = states

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if self._trainer is None or self.trainer.state.fn != "fit":
            return  # loading for inference or testing leaves the caller's random state alone
        states = checkpoint.get("rng_states")
        if not states:
            return
        if isinstance(states, dict):  # written before per-rank states
            states = [states]
        state = states[self.trainer.global_rank] if len(states) == self.trainer.world_size else states[0]
        torch.set_rng_state(state["torch"])
        np.random.set_state(_numpy_state_from_tensors(state["numpy"]))
        random.setstate(state["python"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])

    def _fused_adamw(self, params: list[torch.Tensor]) -> bool:
        """Whether AdamW takes its fused kernel: one pass over all parameters, 8x faster than the default loop
        on CPU (docs/performance.md). Not on devices without it, and not under Lightning's mixed precision
        (``16-mixed``, ``bf16-mixed``) with gradient clipping: its plugin refuses to clip for an optimizer that
        unscales gradients itself, as the fused one does (``trainer=gpu`` crashed at its first step)."""
        if not all(p.device.type in _FUSED_ADAMW_DEVICES for p in params):
            return False
        trainer = self._trainer
        return not (trainer is not None and trainer.gradient_clip_val
                    and isinstance(trainer.precision_plugin, MixedPrecision))

    def configure_optimizers(self):
        hp = self.hparams
        # No weight decay on biases, norms and embeddings (the usual AdamW practice).
        decay, no_decay = [], []
        for name, p in self.model.named_parameters():
            (decay if p.dim() >= 2 and "embedding" not in name else no_decay).append(p)
        fused = self._fused_adamw(decay + no_decay)
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr, betas=tuple(hp.betas), fused=fused or None,
        )
        if hp.scheduler == "constant" and hp.warmup_steps == 0:
            return optimizer
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = hp.warmup_steps

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            if hp.scheduler == "constant":
                return 1.0
            progress = min(1.0, (step - warmup) / max(1, total - warmup))
            return 1.0 - progress if hp.scheduler == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class TextClassifier(ClassifierModule):
    """The project's encoder (:class:`~.models.TransformerClassifier`) built from primitive arguments, all saved as
    hyper-parameters."""

    def __init__(
        self,
        vocab_size: int,
        num_classes: int,
        # encoder (see TransformerClassifier)
        embed_dim: int = 64,
        num_heads: int = 4,
        key_dim: int | None = None,
        value_dim: int | None = None,
        head_combine: str = "concat",
        num_layers: int = 1,
        ffn_dim: int = 256,
        dropout: float = 0.1,
        max_len: int = 512,
        positional: str = "learned",
        pooling: str = "cls",
        pad_id: int = 0,
        activation: str = "relu",
        norm_first: bool = False,
        out_rank: int | None = None,  # rank cap of the attention output projection (None: full)
        compile: bool = False,  # torch.compile the encoder (opt-in; docs/performance.md)
        cuda_graphs: bool = False,  # on CUDA: the training forward and backward replayed as CUDA graphs
        # optimisation
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        scheduler: str = "constant",
        label_smoothing: float = 0.0,
        # carried in the checkpoint for inference and analysis
        label_names: list[str] | None = None,
        tokenizer_json: str | None = None,
        data_cfg: dict | None = None,
    ):
        super().__init__(num_classes, lr, weight_decay, warmup_steps, scheduler, label_smoothing, label_names)
        if compile and cuda_graphs:
            raise ValueError("model.compile=true and model.cuda_graphs=true exclude each other: cuda_graphs compiles "
                             "the training step itself (docs/performance.md); set one of them to false")
        # logger=False: the training app logs the resolved config itself (without the tokenizer blob).
        self.save_hyperparameters(logger=False)
        self.model = TransformerClassifier(**{k: v for k, v in self.hparams.items() if k in _MODEL_ARGS})
        if compile:
            _compile_in_place(self.model)
