"""ShardStore: records from any Dataset, an LRU bounded in bytes, the array-backed fast path; load_splits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from hermes.client.shard_fetch import records_to_tensors
from hermes.common.config import build_config
from hermes.common.datasource import DataError, SampleSource
from hermes.common.models import build_model
from hermes.common.shards import decode_record
from hermes.common.task import ArrayPairDataset, Task
from hermes.server.shardstore import ShardStore, load_splits


class Generated(Dataset):
    """Float images with float targets, generated per index; counts the items read."""

    def __init__(self, n: int, dtype=torch.float32) -> None:
        self.n, self.dtype, self.reads = n, dtype, 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        self.reads += 1
        g = torch.Generator().manual_seed(i)
        return torch.randn((2, 3), generator=g).to(self.dtype), torch.tensor([float(i), -float(i)])


def _decoded(store: ShardStore, shard: int) -> tuple[torch.Tensor, torch.Tensor]:
    samples = records_to_tensors([decode_record(store.record(shard))])
    assert samples is not None
    return samples


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_generic_dataset_becomes_records_of_its_own_dtypes(dtype):
    ds = Generated(50, dtype)
    store = ShardStore(ds, 16, name="gen")
    assert store.num_shards == 4 and [store.samples(s) for s in range(4)] == [16, 16, 16, 2]
    x, y = _decoded(store, 3)
    assert x.dtype == dtype and x.shape == (2, 2, 3) and y.dtype == torch.float32 and y.shape == (2, 2)
    assert torch.equal(x[1], ds[49][0]) and torch.equal(y[1], ds[49][1])
    assert decode_record(store.record(3)).dataset == "gen"


def test_the_lru_keeps_at_most_its_byte_budget_and_reencodes_on_demand():
    ds = Generated(64)
    one = len(ShardStore(Generated(64), 8).record(0))
    store = ShardStore(ds, 8, cache_bytes=3 * one)
    first = store.record(0)
    for s in range(1, 8):
        store.record(s)
    assert store._cached <= 3 * one and len(store._records) == 3  # the three newest
    assert store.cached(0) is None and store.cached(7) is not None
    reads = ds.reads
    assert store.record(0) == first  # encoded again, byte for byte
    assert ds.reads == reads + 8 and store.encoded == 9
    store.record(0)
    assert ds.reads == reads + 8  # now cached


def test_array_backed_datasets_take_the_fast_path_with_the_same_records():
    x = torch.randn(40, 4)
    y = torch.randint(0, 5, (40,))
    idx = list(range(1, 40, 2))

    class ItemByItem(Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            return x[i], y[i]

    fast = [ShardStore(ArrayPairDataset(x, y), 8, name="d"), ShardStore(TensorDataset(x, y), 8, name="d")]
    assert all(s.source.array_backed for s in fast)
    slow = ShardStore(ItemByItem(), 8, name="d")
    assert not slow.source.array_backed
    for s in range(5):
        assert fast[0].record(s) == fast[1].record(s) == slow.record(s)
    # A Subset of an array-backed set is sliced too, and equals the item-by-item Subset.
    sub_fast, sub_slow = ShardStore(Subset(ArrayPairDataset(x, y), idx), 8), ShardStore(Subset(ItemByItem(), idx), 8)
    assert sub_fast.source.array_backed and not sub_slow.source.array_backed
    assert [sub_fast.record(s) for s in range(3)] == [sub_slow.record(s) for s in range(3)]


@pytest.mark.parametrize(("items", "match"), [
    ([(torch.zeros(2), torch.tensor(0))] * 3 + [(torch.zeros(3), torch.tensor(0))], r"data\[3\] input: .* differs"),
    ([(torch.zeros(2), torch.tensor(0)), 5], r"data\[1\]: expected an \(input, target\) pair"),
    ([(torch.zeros(2), torch.tensor(0)), (torch.zeros(2), torch.tensor(0.5))], r"data\[1\] target: torch.float32"),
])
def test_inconsistent_items_are_named_by_index(items, match):
    with pytest.raises(DataError, match=match):
        SampleSource(items).rows(np.arange(len(items)))


def test_a_dtype_records_cannot_carry_is_refused_when_the_store_is_built():
    ds = ArrayPairDataset(torch.zeros((4, 2), dtype=torch.complex64), torch.zeros(4))
    with pytest.raises(DataError, match="complex64"):
        ShardStore(ds, 2)


def test_load_splits_holds_validation_out_of_train_by_index_without_reading_samples():
    ds = Generated(1000)
    task = Task(model=lambda: build_model("mlp", input_shape=(6,), num_classes=2), train_data=ds,
                test_data=Generated(10))
    config = build_config("asp")
    train, validation, test = load_splits(config, task)
    assert ds.reads == 0  # nothing materialised
    assert isinstance(train, Subset) and isinstance(validation, Subset)
    assert len(train) + len(validation) == 1000
    assert not set(train.indices) & set(validation.indices)
    assert len(validation) == round(1000 * config.validation_fraction)


def test_load_splits_of_the_builtin_task_keeps_the_quickstart_split():
    """digits through the builtin task: the same validation samples split_validation always held out."""
    from hermes.common.datasets import load_dataset, split_validation

    config = build_config("hermes")
    train, validation, _ = load_splits(config)
    want_train, want_val = split_validation(load_dataset("digits", seed=config.seed)[0],
                                            config.validation_fraction, config.seed)
    store, vstore = ShardStore(train, 64), ShardStore(validation, 64)
    assert store.source.array_backed and len(train) == len(want_train) and len(validation) == len(want_val)
    x, y = store.rows(3)
    assert np.array_equal(x.numpy(), want_train.x[192:256]) and np.array_equal(y.numpy(), want_train.y[192:256])
    vx, _ = vstore.rows(0)
    assert np.array_equal(vx.numpy(), want_val.x[:64])
    assert decode_record(store.record(0)).dataset == "digits"


class ClassSorted(Dataset):
    """An image folder's order: every sample of class 0, then of class 1, ... (label = index // per_class)."""

    def __init__(self, classes: int = 10, per_class: int = 64) -> None:
        self.per_class, self.n = per_class, classes * per_class

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.full((4,), float(i)), torch.tensor(i // self.per_class)


@pytest.mark.parametrize("array_backed", [False, True])
def test_a_class_sorted_training_set_is_cut_into_mixed_shards(array_backed):
    """Shards come from a seeded permutation of the training samples, not their stored order: cut in
    order, every shard of this set would hold one class (the hermes preset then stayed at chance on the
    image_folder example). Every training sample is in exactly one shard, the same ones for a seed."""
    ds = ClassSorted()
    if array_backed:  # the built-in sets' path (split_validation)
        from hermes.common.datasets import ArrayDataset

        ds = ArrayDataset(name="sorted", x=np.stack([ds[i][0].numpy() for i in range(len(ds))]),
                          y=np.stack([ds[i][1].numpy() for i in range(len(ds))]), num_classes=10)
    task = Task(model=lambda: build_model("mlp", input_shape=(4,), num_classes=10), train_data=ds,
                test_data=ClassSorted(per_class=2))

    def cut(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        """(inputs, labels) of every shard, and the validation size."""
        train, validation, _ = load_splits(build_config("asp", seed=seed), task)
        store = ShardStore(train, 64)
        rows = [store.rows(s) for s in range(store.num_shards)]
        return [x for x, _ in rows], [y for _, y in rows], len(validation)

    inputs, labels, held = cut(0)
    assert held == 64 and len(labels) == 9
    # In order a shard of 64 holds one class or two; mixed, each holds most of the ten.
    assert min(len(torch.unique(y)) for y in labels[:-1]) >= 7
    ids = torch.cat([x[:, 0] for x in inputs]).tolist()  # each sample's input is its index
    assert len(ids) == 640 - 64 and len(set(ids)) == len(ids)  # every training sample once
    assert all(torch.equal(a, b) for a, b in zip(labels, cut(0)[1]))
    assert not all(torch.equal(a, b) for a, b in zip(labels, cut(1)[1]))
