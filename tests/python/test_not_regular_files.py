"""Issue 45 B16: a FIFO or a device given where ferry reads a file or a checkpoint is named for
what it is and refused at once (never "no such file", never a wait for the FIFO's writer)."""

from __future__ import annotations

import os

import pytest

import ferry


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "model.safetensors"
    os.mkfifo(path)
    return str(path)


@pytest.mark.parametrize("which", ["fifo", "/dev/zero"])
def test_load_checkpoint_and_open_say_what_the_path_is(fifo, which):
    path, kind = (fifo, "a FIFO") if which == "fifo" else ("/dev/zero", "a character device")
    with pytest.raises(ferry.CheckpointError, match=kind) as e:
        ferry.load_checkpoint(path)
    assert path in str(e.value) and "no such file" not in str(e.value)
    with pytest.raises(ferry.Error, match=kind) as e:
        ferry.open(path)
    assert path in str(e.value)


def test_an_index_naming_a_fifo_says_so(fifo, tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(
        '{"weight_map": {"w": "model.safetensors"}}')
    with pytest.raises(ferry.CheckpointError, match="is a FIFO"):
        ferry.load_checkpoint(tmp_path / "model.safetensors.index.json")
