import numpy as np
import pytest
import torch

from identifiable_transformers.data import (
    CLS_ID,
    PAD_ID,
    EpochShuffleSampler,
    LengthBucketSampler,
    TextDataModule,
    encode_texts,
)
from identifiable_transformers.data.tokenizer import load_tokenizer


@pytest.fixture
def dm(local_dm, make_rows):
    d = local_dm(make_rows(30), batch_size=8)
    d.prepare_data()
    d.setup("fit")
    return d


def test_contract_attributes(dm):
    assert dm.pad_id == 0
    assert isinstance(dm.vocab_size, int) and dm.vocab_size == dm.tokenizer.get_vocab_size()
    assert dm.num_classes == 3 and dm.label_names == ["sports", "tech", "world"]
    for ds in (dm.train_dataset, dm.val_dataset, dm.test_dataset):
        assert set(ds.column_names) == {"input_ids", "labels"}
        assert all(r[0] == CLS_ID and len(r) <= 32 for r in ds["input_ids"])
        assert set(ds["labels"]) <= {0, 1, 2}


def test_collate_dynamic_padding(dm):
    rows = [dm.train_dataset[i] for i in range(8)]
    b = dm.collate(rows)
    lens = [len(r["input_ids"]) for r in rows]
    assert b["input_ids"].shape == (8, max(lens)) and b["input_ids"].dtype == torch.long
    assert b["attention_mask"].dtype == torch.bool and b["labels"].dtype == torch.long
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        assert b["input_ids"][i, :n].tolist() == r["input_ids"]
        assert (b["input_ids"][i, n:] == PAD_ID).all()
        assert b["attention_mask"][i].tolist() == [True] * n + [False] * (max(lens) - n)
    assert b["labels"].tolist() == [r["labels"] for r in rows]


def test_dataloaders(dm):
    batches = list(dm.train_dataloader())
    assert sum(len(b["labels"]) for b in batches) == len(dm.train_dataset)
    assert max(b["input_ids"].shape[0] for b in batches) == 8
    assert any(b["input_ids"].shape[1] < 32 for b in batches)  # not padded to max_length
    v = next(iter(dm.val_dataloader()))
    t = next(iter(dm.test_dataloader()))
    assert set(v) == set(t) == {"input_ids", "attention_mask", "labels"}


def test_encode_texts_matches_cached_tokenization(local_dm, make_rows):
    rows = make_rows(10)
    d = local_dm(rows, val_fraction=None, test_fraction=None)
    d.prepare_data()
    d.setup("fit")
    texts = [r["text"] for r in rows]
    enc = encode_texts(d.tokenizer, texts, d.max_length)
    got = sorted(tuple(x[m].tolist()) for x, m in zip(enc["input_ids"], enc["attention_mask"]))
    assert got == sorted(tuple(r) for r in d.train_dataset["input_ids"])


def test_idempotent_and_cached(make_rows, write_rows, tmp_path):
    f = write_rows(tmp_path / "t.csv", make_rows(10))

    def mk(**kw):
        args = dict(name="t", source="local", train_file=str(f), cache_dir=str(tmp_path / "c"), max_length=32,
                    vocab_size=200, min_frequency=1)
        return TextDataModule(**{**args, **kw})

    d = mk()
    d.prepare_data()
    path = d.cache_path()
    assert d.timings["total"] > 0
    stamp = (path / "meta.json").stat().st_mtime_ns
    d.setup("fit")
    d.prepare_data()
    d.setup("fit")
    d.setup("test")
    assert (path / "meta.json").stat().st_mtime_ns == stamp
    # a fresh module with the same settings reuses the cache (no rebuild)
    d2 = mk()
    assert d2.cache_path() == path
    d2.prepare_data()
    assert d2.timings == {}  # nothing was built
    # different tokenizer settings / max_length / seed → different cache entry
    assert mk(max_length=16).cache_path() != path
    assert mk(vocab_size=150).cache_path() != path
    assert mk(min_frequency=2).cache_path() != path
    assert mk(split_seed=1).cache_path() != path
    # a changed file → different cache entry
    write_rows(f, make_rows(11))
    assert mk().cache_path() != path
    # setup without prepare_data still works (single process)
    d3 = mk(max_length=20)
    d3.setup("fit")
    assert all(len(r) <= 20 for r in d3.train_dataset["input_ids"])


def test_saved_tokenizer_and_state_dict_round_trip(dm, tmp_path):
    p = dm.save_tokenizer(tmp_path / "run" / "tokenizer.json")
    assert p == tmp_path / "run" / "tokenizer.json"
    tok = load_tokenizer(p)
    texts = ["goal team win", "chip cloud zzz"]
    assert [e.ids for e in tok.encode_batch(texts)] == [e.ids for e in dm.tokenizer.encode_batch(texts)]
    state = dm.state_dict()
    # the tokenizer is kept once per checkpoint, in the model's hyper-parameters, not in the data state
    assert state["label_names"] == dm.label_names and "tokenizer_json" not in state
    fresh = TextDataModule(source="local", train_file="unused.csv", cache_dir=str(tmp_path / "x"))
    fresh.load_state_dict(state)
    assert fresh.meta["label_names"] == dm.label_names


def test_tokenizer_file_reuses_exact_tokenizer(dm, local_dm, make_rows, tmp_path):
    p = dm.save_tokenizer(tmp_path / "tok")
    other = local_dm(make_rows(10, seed=5), tokenizer_file=str(p), cache_dir=str(tmp_path / "other"))
    other.prepare_data()
    other.setup("fit")
    assert other.tokenizer.to_str() == dm.tokenizer.to_str()


def test_limit_train_examples(local_dm, make_rows):
    d = local_dm(make_rows(30), limit_train_examples=10)
    d.prepare_data()
    d.setup("fit")
    assert len(d.train_dataset) == 10 and len(d.val_dataset) == 9


def test_length_bucket_sampler_groups_lengths():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, size=1000)
    s = LengthBucketSampler(lengths, batch_size=10, seed=0, pool_batches=100)  # one pool
    order = list(s)
    assert sorted(order) == list(range(1000))  # a permutation
    spreads = [np.ptp(lengths[order[i:i + 10]]) for i in range(0, 1000, 10)]
    rand = [np.ptp(lengths[rng.permutation(1000)[:10]]) for _ in range(100)]
    assert np.mean(spreads) < 0.2 * np.mean(rand)
    s.set_epoch(1)
    assert list(s) != order  # reshuffled per epoch


def test_length_bucketing_in_dataloader_and_kept_under_ddp(local_dm, make_rows):
    d = local_dm(make_rows(30), length_bucketing=True)
    d.prepare_data()
    d.setup("fit")
    dl = d.train_dataloader()
    assert isinstance(dl.sampler, LengthBucketSampler)
    assert sum(len(b["labels"]) for b in dl) == len(d.train_dataset)

    d._shard = lambda: (1, 2)  # rank 1 of 2
    dl = d.train_dataloader()
    assert isinstance(dl.sampler, LengthBucketSampler) and (dl.sampler.rank, dl.sampler.world_size) == (1, 2)
    assert sum(len(b["labels"]) for b in dl) == -(-len(d.train_dataset) // 2)
    assert len(d.val_dataloader().sampler) == len(range(1, len(d.val_dataset), 2))


def test_datamodule_refuses_a_trainer_that_would_shard_again(dm):
    from types import SimpleNamespace

    dm.trainer = SimpleNamespace(world_size=2, global_rank=0,
                                 _accelerator_connector=SimpleNamespace(use_distributed_sampler=True))
    with pytest.raises(ValueError, match="use_distributed_sampler=False"):
        dm.train_dataloader()


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_sampler_shards_cover_the_data(shuffle, world):
    n = 103
    shards = [list(EpochShuffleSampler(n, seed=3, shuffle=shuffle, rank=r, world_size=world)) for r in range(world)]
    assert all(len(s) == len(EpochShuffleSampler(n, 3, shuffle, r, world)) for r, s in enumerate(shards))
    flat = [i for s in shards for i in s]
    assert set(flat) == set(range(n))
    if shuffle:  # every rank the same number of batches: the order wraps around (as DistributedSampler does)
        assert {len(s) for s in shards} == {-(-n // world)} and len(flat) - n < world
    else:  # evaluation: each example exactly once
        assert sorted(flat) == list(range(n))


@pytest.mark.parametrize("bucket", [False, True])
@pytest.mark.parametrize("rank,world", [(0, 1), (1, 3)])
def test_sampler_resume_at_continues_the_interrupted_epoch(bucket, rank, world):
    lengths = np.random.default_rng(0).integers(1, 50, size=97)
    make = lambda: (LengthBucketSampler(lengths, 8, seed=5, pool_batches=3, rank=rank, world_size=world)  # noqa: E731
                    if bucket else EpochShuffleSampler(97, seed=5, rank=rank, world_size=world))
    straight = make()
    epochs = []
    for e in range(3):
        straight.set_epoch(e)
        epochs.append(list(straight))
    assert epochs[1] != epochs[2]
    resumed = make()
    resumed.resume_at(1, 16)  # two batches of 8 into epoch 1
    assert list(resumed) == epochs[1][16:]  # Lightning's set_epoch(1) may come first or not at all
    resumed.set_epoch(2)
    assert list(resumed) == epochs[2]  # only the interrupted epoch is shortened
    again = make()
    again.resume_at(1, 16)
    again.set_epoch(1)
    assert list(again) == epochs[1][16:]
    with pytest.raises(ValueError, match="cannot resume"):
        make().resume_at(0, len(make()) + 1)


def test_omegaconf_lists_accepted(tmp_path, make_rows, write_rows):
    from omegaconf import OmegaConf

    f = write_rows(tmp_path / "t.csv", make_rows(10))
    cfg = OmegaConf.create({"text_fields": ["text"], "splits": {"train": "train", "validation": None, "test": None},
                            "label_names": ["sports", "tech", "world"]})
    d = TextDataModule(source="local", train_file=str(f), text_fields=cfg.text_fields, splits=cfg.splits,
                       label_names=cfg.label_names, cache_dir=str(tmp_path / "c"), vocab_size=100, min_frequency=1)
    d.prepare_data()
    d.setup("fit")
    assert d.label_names == ["sports", "tech", "world"]


def test_checkpointed_position_resumes_the_next_train_loader_once(dm):
    full = EpochShuffleSampler(len(dm.train_dataset), seed=dm.shuffle_seed)
    full.set_epoch(2)
    order = list(full)
    dm.load_state_dict({**dm.state_dict(), "train_position": {"epoch": 2, "samples": 8, "world_size": 1}})
    assert list(dm.train_dataloader().sampler) == order[8:]
    assert list(dm.train_dataloader().sampler) == list(EpochShuffleSampler(len(order), dm.shuffle_seed))  # once only
    dm.load_state_dict({**dm.state_dict(), "train_position": {"epoch": 2, "samples": 8, "world_size": 2}})
    with pytest.warns(UserWarning, match="restarts from its first batch"):
        assert list(dm.train_dataloader().sampler) == order
