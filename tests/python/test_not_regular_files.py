"""Issue 45 B16: a FIFO or a device given where ferry reads a file or a checkpoint is named for
what it is and refused at once (never "no such file", never a wait for the FIFO's writer)."""

from __future__ import annotations

import os
import threading

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


@pytest.mark.parametrize("load", ["load", "fromfile", "read_into", "load_file", "safe_open"])
def test_array_and_safetensors_loaders_refuse_a_fifo_without_waiting(fifo, load):
    # ferry.load read the .npy header with open(), which waits for the FIFO's writer: forever.
    import numpy as np

    import ferry.safetensors.torch  # noqa: F401 (ferry.safetensors.torch.load_file)
    calls = {"load": lambda: ferry.load(fifo), "fromfile": lambda: ferry.fromfile(fifo, "uint8"),
             "read_into": lambda: ferry.read_into(fifo, np.empty(4, np.uint8)),
             "load_file": lambda: ferry.safetensors.torch.load_file(fifo),
             "safe_open": lambda: ferry.safetensors.safe_open(fifo, "numpy").__enter__()}
    outcome: list = []

    def run():
        try:
            calls[load]()
            outcome.append(None)
        except BaseException as e:  # noqa: B902 (handed to the test's thread)
            outcome.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # waiting for a writer: be one, so that the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
        pytest.fail(f"{load} waited on the FIFO for a writer")
    assert isinstance(outcome[0], ferry.Error) and "a FIFO" in str(outcome[0]), outcome
    assert fifo in str(outcome[0])
