"""ferry's stager for dcp.async_save (ferry._stager.Stager, issue 51 item 6) on CPU tensors, which
torch 1.13 can make: the staged state dict matches and no longer follows the caller's tensors,
the pool is reused (one allocation over 20 saves, its memory flat), a second stage waits for the
first to be dropped, unsupported values are refused by name. GPU copies are tested in C++ on the
libcuda double (gpu_async_staging_test.cc) and end to end in test_dcp_async.py."""
import gc
import time

import pytest

torch = pytest.importorskip("torch")

from ferry._stager import Stager  # noqa: E402


def _state(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 33, generator=g)
    return {
        "model": {"w": w, "w_t": w.t(), "bf16": torch.randn(5, 7, generator=g).to(torch.bfloat16),
                  "big": torch.randn(1 << 18, generator=g), "empty": torch.empty(0, 3)},
        "optim": {"state": {0: {"step": torch.tensor(7.0), "mask": torch.rand(9, generator=g) > 0.5,
                                "ids": torch.arange(seed, seed + 11)}},
                  "param_groups": [{"lr": 0.1, "params": [0]}]},
        "note": "text",
        "pair": (torch.ones(3, dtype=torch.int32), 4),
    }


def _same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and b.device.type == "cpu"
        assert torch.equal(a.cpu(), b), (a, b)
    else:
        assert a == b


def test_staged_state_dict_matches_and_is_a_copy():
    stager = Stager()
    sd = _state(1)
    staged = stager.stage(sd).result()
    stager.synchronize_staging()
    _same(sd, staged)
    assert staged["model"]["big"].data_ptr() != sd["model"]["big"].data_ptr()
    assert staged["model"]["big"].data_ptr() % 4096 == 0
    sd["model"]["big"].fill_(3.0)  # the training step after staging
    sd["optim"]["param_groups"][0]["lr"] = 0.5
    assert not torch.equal(staged["model"]["big"], sd["model"]["big"])
    assert staged["optim"]["param_groups"][0]["lr"] == 0.1
    del staged
    stager.close()


def test_pool_is_reused_and_flat_over_twenty_saves():
    stager = Stager()
    sd = _state(2)
    stager.stage(sd).result()
    first = stager.report()
    assert first["allocations"] == 1 and first["growths"] == 1
    for i in range(20):
        sd["model"]["big"].fill_(float(i))
        staged = stager.stage(sd).result()
        assert torch.equal(staged["model"]["big"], sd["model"]["big"])
        del staged
    r = stager.report()
    assert r["stages"] == 21
    assert r["allocations"] == first["allocations"]
    assert r["pinned_bytes"] == first["pinned_bytes"]
    assert r["last_bytes"] == first["last_bytes"]
    stager.close()
    assert stager.report()["pinned_bytes"] == 0


def test_a_bigger_state_dict_grows_the_pool_once():
    stager = Stager()
    small, big = _state(3), _state(4)
    big["extra"] = torch.zeros(1 << 19)
    stager.stage(small).result()
    stager.stage(big).result()
    stager.stage(small).result()
    stager.stage(big).result()
    assert stager.report()["allocations"] == 2
    stager.close()


def test_the_next_stage_waits_until_the_previous_staged_dict_is_dropped():
    stager = Stager(wait_for_previous_s=0.2)
    sd = _state(5)
    held = stager.stage(sd).result()
    t0 = time.monotonic()
    with pytest.raises(Exception, match="still in use"):
        stager.stage(sd)
    assert time.monotonic() - t0 >= 0.2
    with pytest.raises(Exception, match="still in use"):
        stager.close()
    del held
    gc.collect()
    _same(sd, stager.stage(sd).result())
    stager.close()


def test_unsupported_values_are_refused_by_name():
    stager = Stager()
    with pytest.raises(TypeError, match="'model.sparse'"):
        stager.stage({"model": {"sparse": torch.eye(3).to_sparse()}})
    stager.close()
    with pytest.raises(RuntimeError, match="after close"):
        stager.stage({})
