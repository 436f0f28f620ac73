"""The top-level flags train and test are booleans: anything else is one clear error before any work.

Hydra reads ``test=no`` as the string 'no' and ``test=1`` as the int 1; a flag that is only tested for
truth would take 'no' as true and run the test. Checked on check_config and on run(cfg), which must stop
before the data is prepared.
"""

from __future__ import annotations

import pytest

from identifiable_transformers.common.errors import ConfigError
from identifiable_transformers.run.config_checks import check_config
from identifiable_transformers.run.training import run


@pytest.mark.parametrize("key", ["train", "test"])
@pytest.mark.parametrize("value, shown", [("no", "'no'"), ("yes", "'yes'"), ("1", "1"), ("null", "None")])
def test_a_flag_that_is_not_a_boolean_is_refused(make_cfg, key, value, shown):
    with pytest.raises(ConfigError) as info:
        check_config(make_cfg(f"{key}={value}"))
    assert str(info.value) == f"{key}={shown} is not true or false: pass e.g. {key}=true"


@pytest.mark.parametrize("key", ["train", "test"])
@pytest.mark.parametrize("value", ["true", "false"])
def test_booleans_pass(make_cfg, key, value):
    check_config(make_cfg(f"{key}={value}"))


def test_run_stops_at_test_no_before_the_data(make_cfg, tmp_path):
    cfg = make_cfg("test=no", out="run")
    with pytest.raises(ConfigError, match="test='no' is not true or false"):
        run(cfg)
    assert not (tmp_path / "run").exists()  # nothing written: no run folder, no tokenizer, no checkpoint
