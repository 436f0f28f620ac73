"""The LightningModules (classifier: ClassifierModule, TextClassifier), their sync-free metrics, the no-sync check
of a training step, and checkpoints (best/last with checksums; reading untrusted ones)."""
