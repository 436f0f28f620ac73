"""model=pretrained's cheaper diagnostics defaults (issue 39), and that they stay overridable and confined to it."""


def test_pretrained_sets_cheaper_diagnostics_and_the_others_keep_theirs(make_cfg):
    cfg = make_cfg("model=pretrained", "model.name_or_path=x", fast=False)
    assert cfg.callbacks.identifiability.probe_size == 16
    assert (cfg.callbacks.faithfulness.random_draws, cfg.callbacks.faithfulness.adversarial_examples,
            cfg.callbacks.faithfulness.adversarial_steps, cfg.callbacks.faithfulness.adversarial_restarts) == (3, 2, 100, 1)
    assert cfg.callbacks.identifiability.chunk_size == 2
    assert cfg.callbacks.identifiability.key_aware_every_n_epochs is None  # once, at the end of fit
    cfg = make_cfg("model=pretrained", "model.name_or_path=x", "callbacks.identifiability.probe_size=40",
                   "callbacks.identifiability.key_aware_every_n_epochs=2", fast=False)
    assert cfg.callbacks.identifiability.probe_size == 40
    assert cfg.callbacks.identifiability.key_aware_every_n_epochs == 2
    cfg = make_cfg(fast=False)  # the project's own encoders: the full diagnostics
    assert cfg.callbacks.identifiability.probe_size == 64
    assert cfg.callbacks.identifiability.key_aware_every_n_epochs == 1
    assert (cfg.callbacks.faithfulness.random_draws, cfg.callbacks.faithfulness.adversarial_steps) == (10, 300)
