"""Everything Hugging Face: hub ids and folders, offline (loading); the family adapters that expose each
encoder's attention internals (adapters); the pretrained classifier (encoder); its tokenizer's data module (data);
its LightningModule (module)."""
