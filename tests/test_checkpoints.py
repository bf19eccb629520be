"""A run's checkpoint: streamed into an atomic file, read back memory-mapped, locally and on S3."""

import os
import sys

import pytest
import torch
from torch import nn

from cryocube import store
from cryocube.families.segmentation.train import load_state, save_state


def _net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.Conv2d(8, 2, 1))


def _same(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_failed_write_keeps_the_old_file_and_leaves_no_part(tmp_path):
    url = str(tmp_path / "run" / "best.pt")
    store.write_atomic(url, b"old")
    with pytest.raises(RuntimeError), store.atomic_file(url) as f:
        f.write(b"half of the new")
        raise RuntimeError("the writer died")
    assert open(url, "rb").read() == b"old"
    assert os.listdir(tmp_path / "run") == ["best.pt"]
    with store.atomic_file(url) as f:
        f.write(b"new")
    assert open(url, "rb").read() == b"new"
    assert os.listdir(tmp_path / "run") == ["best.pt"]


def test_a_file_renamed_before_its_fsync_is_whole_and_made_durable_later(tmp_path):
    """A checkpoint's write starts the disk's writeback and returns; the test task's fsync waits."""
    url = str(tmp_path / "run" / "best.pt")
    store.write_atomic(url, b"old")
    with pytest.raises(RuntimeError), store.atomic_file(url, durable=False) as f:
        f.write(b"half of the new")
        raise RuntimeError("the writer died")
    assert open(url, "rb").read() == b"old" and os.listdir(tmp_path / "run") == ["best.pt"]
    with store.atomic_file(url, durable=False) as f:
        f.write(b"new" * 1000)
    store.make_durable(url)
    assert open(url, "rb").read() == b"new" * 1000
    with open(url, "rb") as f:  # on Linux the kernel takes the request; else fsync does it all
        assert store._start_writeback(f.fileno()) == sys.platform.startswith("linux")
    with pytest.raises(FileNotFoundError):
        store.make_durable(str(tmp_path / "missing.pt"))


def test_a_checkpoint_round_trips_on_disk_and_refuses_another_model(tmp_path):
    trained, fresh = _net(0), _net(1)
    assert not _same(trained, fresh)
    url = f"file://{tmp_path}/runs/abc/best.pt"
    save_state(trained.state_dict(), url)
    load_state(fresh, url)
    assert _same(trained, fresh)
    # the module owns its tensors: the memory-mapped file can go
    os.remove(tmp_path / "runs" / "abc" / "best.pt")
    assert _same(trained, fresh)
    save_state(nn.Conv2d(3, 4, 1).state_dict(), url)
    with pytest.raises(RuntimeError, match="Missing key"):
        load_state(fresh, url)


def test_a_checkpoint_round_trips_over_s3(s3_bucket):
    name, opts = s3_bucket
    url = f"s3://{name}/results/runs/abc/best.pt"
    store.register_options(url, opts)
    trained, fresh = _net(0), _net(1)
    save_state(trained.state_dict(), url)
    load_state(fresh, url)
    assert _same(trained, fresh)
    with pytest.raises(RuntimeError), store.atomic_file(url) as f:
        f.write(b"half")
        raise RuntimeError("the writer died")
    load_state(fresh, url)  # the object is still the whole checkpoint
    assert _same(trained, fresh)
