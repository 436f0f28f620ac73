"""The MiniLM study preset (issue 39) composes to what multirun_sweeps/sweep/minilm.yaml's header says: the pretrained
classifier with the checkpoint's pooling, 64 word pieces, 2 epochs, the key-aware count at the end of fit, and
6 jobs (rt_offline and synthetic_contrast x seeds 1-3), each task's seeds together. Expected values written out."""

def test_minilm_preset_is_the_pretrained_classifier_on_two_tasks_and_three_seeds(make_cfg, sweep_jobs):
    cfg = make_cfg("+sweep=minilm", "model.name_or_path=some/folder", fast=False)
    assert cfg.model._target_ == "identifiable_transformers.hf.module.PretrainedTextClassifier"
    assert cfg.data._target_ == "identifiable_transformers.hf.data.PretrainedTextDataModule"
    assert cfg.model.pooling is None and cfg.model.keep_head is False  # the checkpoint's pooling, a fresh head
    assert cfg.data.max_length == cfg.model.max_len == 64 and cfg.trainer.max_epochs == 2
    assert cfg.model.lr == 5e-5
    assert cfg.callbacks.identifiability.key_aware_every_n_epochs is None and cfg.callbacks.faithfulness.final
    f = cfg.callbacks.faithfulness  # model=pretrained's end-of-fit search and random control, as the study ran them
    assert (f.adversarial_examples, f.adversarial_steps, f.adversarial_restarts, f.random_draws) == (2, 100, 1, 3)
    assert cfg.callbacks.identifiability.probe_size == 16
    assert "csv" in str(cfg.logger)
    jobs = sweep_jobs(cfg)
    assert [(j["data"], j["seed"]) for j in jobs] == [(d, s) for d in ("rt_offline", "synthetic_contrast")
                                                      for s in ("1", "2", "3")]
