"""Identifiable transformers: a reimplementation of Bhardwaj et al. (ACL 2021)."""

from . import resolvers  # noqa: F401  (the configs' OmegaConf resolvers, also in sweep worker processes)
