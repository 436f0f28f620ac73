#!/usr/bin/env bash
# Where do the context-mixing explainers (value zeroing, ALTI, norm_resln) stand beside raw and effective attention,
# leave-one-out and integrated gradients, per design and key size? (issue 40, part 2; docs/faithfulness.md)
# The committed CPU regimes, each a sweep of {baseline, identifiable} x key sizes x seeds 1-3, every per-epoch
# explainer of conf/callbacks/faithfulness.yaml (the context-mixing ones included) and the end-of-fit integrated
# gradients, then the report of each (faithfulness.md, faithfulness_designs.md) under OUT/report/<regime>:
#   contrast  +sweep=faithfulness_contrast seed=1,2,3 (24 runs of 5 epochs, 256 probes, its own end-of-fit tier)
#   order     +sweep=faithfulness_regimes data=synthetic_order (24 runs, 10 epochs)
#   rt        +sweep=faithfulness_regimes data=rt_offline (24 runs, 5 epochs)
# The regimes' sweeps here add integrated gradients at the end of fit (8 steps) but no adversarial attention.
# Usage: bash multirun_sweeps/context_mixing.sh OUT [hydra overrides for every run, e.g. hydra/launcher=joblib_local]
# A tiny check of the pipeline (2 runs per regime, minutes): bash multirun_sweeps/context_mixing.sh /tmp/cm seed=1 \
#   model.key_dim=1 trainer.max_epochs=1 trainer.limit_train_batches=2 trainer.limit_val_batches=1 \
#   trainer.limit_test_batches=1 callbacks.faithfulness.every_n_epochs=1 callbacks.identifiability.every_n_epochs=1 \
#   callbacks.identifiability.probe_size=16 callbacks.faithfulness.final=false trainer.enable_progress_bar=false
set -euo pipefail
out=${1:?usage: bash multirun_sweeps/context_mixing.sh OUT [overrides]}
shift
python=${PYTHON:-python}
ig=(callbacks.faithfulness.final=true callbacks.faithfulness.ig_steps=8 callbacks.faithfulness.adversarial_examples=0)
"$python" train.py -m +sweep=faithfulness_contrast seed=1,2,3 hydra.sweep.dir="$out/contrast" "$@"
"$python" train.py -m +sweep=faithfulness_regimes data=synthetic_order "${ig[@]}" hydra.sweep.dir="$out/order" "$@"
"$python" train.py -m +sweep=faithfulness_regimes data=rt_offline "${ig[@]}" hydra.sweep.dir="$out/rt" "$@"
for regime in contrast order rt; do
  "$python" -m identifiable_transformers.report "$out/$regime" --out "$out/report/$regime" --no-key-aware --overwrite
done
