"""Route reports and process counters: every C++ field is bound, text and dict forms agree."""

import json
import os
import pickle

import numpy as np
import pytest

import ferry


def _read(path, n=1 << 20):
    with ferry.open(path) as f:
        f.read(np.empty(n, np.uint8))
        return f.last_route


def test_report_fields_describe_the_request(data_file):
    path, _ = data_file
    r = _read(path)
    assert (r.op, r.file, r.offset, r.requested, r.bytes) == ("read", path, 0, 1 << 20, 1 << 20)
    assert r.memory == "host" and r.device == -1
    assert r.tasks == r.posix_tasks + r.cufile_tasks >= 1
    assert r.seconds >= 0 and r.direct is False
    assert r.cufile_tasks == 0 and not r.cufile.observable and r.cufile.why_not
    assert any(reason.code == "engine" for reason in r.reasons)
    assert str(r) == r.to_text() and str(r).startswith("route: ")
    # The text's headline is the verdict's first clause; the reasons the verdict goes on with are
    # listed below it, once (issue 35: each fact said once).
    assert str(r).startswith("route: " + r.verdict.split(": ")[0] + "\n")
    assert all(reason.text in str(r) for reason in r.reasons) and r.verdict in repr(r)


def test_every_json_field_is_an_attribute(data_file):
    """Fails when route.h gains a field that to_json() shows but the binding lacks."""
    r = _read(data_file[0])
    d = json.loads(r.to_json())
    for key, value in d.items():
        if key == "layer1":
            for k in value:
                assert hasattr(r, k), f"RouteReport.{k} is not bound"
        elif key == "layer2":
            for k, v in value.items():
                if k == "nvfs_module":  # nvidia-fs's own counters: the module_* fields
                    for m in v:
                        assert getattr(r.cufile, f"module_{m}") == v[m], f"cufile.module_{m}"
                else:
                    assert getattr(r.cufile, k) == v, f"RouteReport.cufile.{k} is not bound"
        elif key == "page_cache":
            for k, v in value.items():
                assert getattr(r.page_cache, k) == v, f"RouteReport.page_cache.{k} is not bound"
        else:
            assert getattr(r, key) == value, key
    assert [x["code"] for x in d["layer1"]["reasons"]] == [x.code for x in r.reasons]


def test_stats_count_requests_and_reset(data_file):
    path, _ = data_file
    ferry.stats.reset()
    assert ferry.stats().requests == 0
    _read(path, 1000)
    _read(path, 2000)
    s = ferry.stats()
    assert s.requests == 2 and s.bytes_read == 3000 and s.failed_requests == 0
    assert s.reasons.get("engine") == 2
    d = s.to_dict()
    for key, value in d.items():
        assert getattr(s, key) == value, f"Stats.{key} is not bound"
    ferry.stats.reset()
    assert ferry.stats().bytes_read == 0


def test_cuda_status_is_a_report_not_an_error():
    status = ferry.cuda_status()
    assert status.available or status.why_not


def test_cufile_status_is_a_dict_with_the_reason():
    status = ferry.cufile_status(open_driver=False)
    assert status["loaded"] or status["load_error"]


def test_warm_up_without_a_gpu_names_the_reason():
    if ferry.cuda_status().available and ferry.cuda_status().gpus:
        pytest.skip("a GPU is present: tests/python/test_gpu.py covers warm_up there")
    with pytest.raises(ferry.CudaError, match="CUDA|driver|GPU"):
        ferry.warm_up(0)


def test_report_carries_residency_and_workers(data_file):
    r = _read(data_file[0])
    assert r.page_cache.known, r.page_cache.why_not
    assert r.page_cache.bytes == r.bytes and 0 <= r.page_cache.resident <= r.bytes
    assert 0.0 <= r.page_cache.fraction <= 1.0
    assert r.workers >= 1 and r.direct_tasks == 0
    assert "page cache before the request" in r.to_text()


def test_page_cache_residency_is_one_public_call(data_file, tmp_path):
    # Issue 32: the engine's residency measurement, public: by path (str or PathLike) or by
    # descriptor, a range or the rest of the file, sampled or every page.
    path, data = data_file
    _read(path, len(data))
    whole = ferry.page_cache_residency(path, exact=True)
    assert isinstance(whole, ferry.PageCacheResidency)
    assert whole.known, whole.why_not
    assert whole.bytes == len(data) and whole.resident == len(data) and not whole.estimated
    with open(path, "rb") as f:
        part = ferry.page_cache_residency(f.fileno(), 4096, 4096)
    assert (part.bytes, part.resident) == (4096, 4096)
    assert ferry.page_cache_residency(os.fspath(path), len(data)).bytes == 0
    with pytest.raises(ferry.IoError, match="missing.bin"):
        ferry.page_cache_residency(tmp_path / "missing.bin")


def test_to_dict_keys_are_the_attributes(data_file):
    r = _read(data_file[0])
    d = r.to_dict()
    for key, value in d.items():
        attr = getattr(r, key)
        if key in ("page_cache", "cufile", "source"):
            assert value == attr.to_dict()
        elif key == "reasons":
            assert value == [x.to_dict() for x in attr]
        else:
            assert value == attr, key
    assert {"op", "file", "bytes", "tasks", "reasons", "cufile", "page_cache"} <= set(d)


def test_reports_pickle_to_equal_objects(data_file):
    """Issue 19, bug 3: RouteReport (and so RouteError) did not pickle."""
    r = _read(data_file[0])
    for obj in (r, r.reasons[0], r.page_cache, r.cufile, r.source, ferry.stats(),
                ferry.cuda_status()):
        copy = pickle.loads(pickle.dumps(obj))
        assert copy == obj and type(copy) is type(obj)
    assert pickle.loads(pickle.dumps(r)).to_text() == r.to_text()
    assert _read(data_file[0], 1000) != r


def test_no_request_yet_is_none_not_a_report_of_zero_tasks(data_file):
    with ferry.open(data_file[0]) as f:
        assert f.last_route is None
        fut = f.pread(np.empty(1 << 20, np.uint8))
        assert fut.last_route.bytes == 1 << 20
        assert f.last_route is not None and f.last_route.bytes == 1 << 20
