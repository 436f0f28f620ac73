"""Where a run's numbers go: the loggers a config builds (loggers), W&B's epoch axis, tables and artifacts
(wandb_logging), the saved W&B workspace of the key-size study (workspace)."""
