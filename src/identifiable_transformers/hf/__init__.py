"""Everything Hugging Face: hub ids and folders, offline (loading); the family adapters that expose each
encoder's attention internals (adapters); the pretrained classifier (encoder); a checkpoint's own classifier, or a
bare encoder, read as it is (sequence_classifier: load_hf_classifier); its tokenizer's data module, pairs included
(data); its LightningModule (module)."""
