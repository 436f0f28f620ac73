"""What train.py does around the model: build everything from the config and fit (training), the typed config
checks (config_checks), the run folder's checks and lock (checks, lock), metrics_history.csv (history)."""
