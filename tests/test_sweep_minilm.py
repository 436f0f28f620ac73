"""The MiniLM study presets (issue 39) compose to what multirun_sweeps/sweep/minilm.yaml's and minilm_contrast.yaml's
headers say: the pretrained classifier with the checkpoint's pooling, 64 word pieces, 2 epochs, the key-aware count
at the end of fit, 3 seeds each; the contrast arm on sentences that fit 64 word pieces. Expected values written out."""


def test_minilm_preset_is_the_pretrained_classifier_on_rotten_tomatoes_and_three_seeds(make_cfg, sweep_jobs):
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
    assert [(j["data"], j["seed"]) for j in sweep_jobs(cfg)] == [("rt_offline", s) for s in ("1", "2", "3")]


def test_minilm_contrast_preset_is_the_same_study_on_sentences_of_16_to_20_words(make_cfg, sweep_jobs):
    cfg = make_cfg("+sweep=minilm_contrast", "model.name_or_path=some/folder", "data=synthetic_contrast", fast=False)
    base = make_cfg("+sweep=minilm", "model.name_or_path=some/folder", "data=synthetic_contrast", fast=False)
    assert cfg.model == base.model and cfg.trainer == base.trainer and cfg.callbacks == base.callbacks
    assert (cfg.data.synthetic.min_length, cfg.data.synthetic.max_length) == (16, 20)
    assert (base.data.synthetic.min_length, base.data.synthetic.max_length) == (24, 60)  # the task's own lengths
    assert {k: v for k, v in cfg.data.synthetic.items() if "length" not in k} == {
        k: v for k, v in base.data.synthetic.items() if "length" not in k}
    assert [(j["data"], j["seed"]) for j in sweep_jobs(cfg)] == [("synthetic_contrast", s) for s in ("1", "2", "3")]
