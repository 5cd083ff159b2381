"""Host loads by residency (issue 48): a file resident in the page cache loads into host memory
as views of a private mapping, byte for byte what the read route gives (odd dtypes, unaligned
offsets), writes never reaching the file, the tensors outliving the file; a cold file is mapped
too and read in by parallel faults before the load returns; the report names the route; the
setting forces each route, for load_checkpoint, ferry.safetensors and `ferry load`."""

from __future__ import annotations

import gc
import json
import os
import subprocess

import pytest

import ferry
from ferry.kvikio.cufile import drop_file_page_cache
from ferry.safetensors.numpy import load_file as np_load_file
from test_checkpoint import DTYPES, PACKED, check_numpy, encode, every_dtype, rng_bytes


def unaligned():
    """Tensors whose offsets are not multiples of their dtype's size: an odd byte first."""
    return [("odd", "U8", (3,), rng_bytes(3, 1)), ("f32", "F32", (2, 3), rng_bytes(24, 2)),
            ("i64", "I64", (4,), rng_bytes(32, 3)), ("bf16", "BF16", (5,), rng_bytes(10, 4)),
            ("c64", "C64", (1,), rng_bytes(8, 5))]


@pytest.fixture(params=["every_dtype", "unaligned"])
def written(tmp_path, request):
    tensors = every_dtype() if request.param == "every_dtype" else unaligned()
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode(tensors))
    return str(path), tensors


def test_mapped_numpy_arrays_are_the_read_routes_bytes(written):
    path, tensors = written
    with ferry.settings(host_load="read"):
        read = np_load_file(path)
    mapped = np_load_file(path)  # auto: the file was just written, so it is resident
    report = ferry.last_load_report()
    check_numpy(mapped, tensors)
    for name in read:
        assert mapped[name].tobytes() == read[name].tobytes(), name
    (route,) = report.host_routes
    assert route.path == "mapped" and "resident in the page cache" in route.reason
    misaligned = [t for t in tensors if t[3] and t[1] not in PACKED
                  and (len(encode(tensors)) - sum(len(x[3]) for x in tensors)
                       + sum(len(x[3]) for x in tensors[:tensors.index(t)]))
                  % (DTYPES[t[1]][0] // 8)]
    assert route.copied == len(misaligned)
    assert route.tensors == sum(1 for t in tensors if t[3]) - len(misaligned)
    assert len(report.routes) == (1 if misaligned else 0)  # the copies' one gathered read


def test_a_write_to_a_mapped_tensor_never_reaches_the_file(tmp_path):
    tensors = every_dtype()
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode(tensors))
    before = path.read_bytes()
    arrays = ferry.load_checkpoint(path, framework="numpy", host_load="map")
    assert ferry.last_load_report().host_routes[0].path == "mapped"
    arrays["t.F32"][...] = 7
    assert path.read_bytes() == before
    assert ferry.load_checkpoint(path, framework="numpy")["t.F32"].tobytes() == tensors[9][3]


def test_mapped_arrays_survive_the_file_being_deleted(tmp_path):
    tensors = every_dtype()
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode(tensors))
    arrays = ferry.load_checkpoint(path, framework="numpy", host_load="map")
    os.remove(path)
    path.write_bytes(b"\0" * 4096)  # another file by that name
    gc.collect()
    check_numpy(arrays, tensors)


def test_the_setting_forces_each_route_and_the_report_says_why(tmp_path):
    tensors = every_dtype()
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode(tensors))
    for setting, path_word, reason in [("read", "read", "host_load=read"),
                                       ("map", "mapped", "host_load=map")]:
        check_numpy(ferry.load_checkpoint(path, framework="numpy", host_load=setting), tensors)
        (route,) = ferry.last_load_report().host_routes
        assert (route.path, route.reason.startswith(reason)) == (path_word, True)
        assert f"mapped: {reason}" in repr(ferry.last_load_report()) or path_word == "read"
    with pytest.raises(ValueError, match="auto .map files resident in the page cache"):
        ferry.load_checkpoint(path, host_load="mmap")


def test_a_file_dropped_from_the_page_cache_is_mapped_and_read_in_before_the_return(tmp_path):
    # Parallel faults into the mapping outran ferry's read into fresh memory (NOTES §31, round 2).
    tensors = every_dtype()
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode(tensors))
    ckpt = ferry.checkpoint.Checkpoint(path)  # its header read: the pages go after
    drop_file_page_cache(path)
    if ferry.page_cache_residency(str(path)).fraction >= 0.9:
        pytest.skip("this file system keeps the pages (tmpfs?)")
    check_numpy(ckpt.load("numpy"), tensors)
    (route,) = ferry.last_load_report().host_routes
    assert route.path == "populated" and "not resident in the page cache" in route.reason
    assert "read in by parallel faults before the load returns" in route.reason
    assert ferry.page_cache_residency(str(path)).fraction == 1.0
    assert "populated: not resident" in repr(ferry.last_load_report())


def test_cli_load_host_maps_a_resident_file_and_checksums_the_same(tmp_path):
    cli = os.environ.get("FERRY_CLI")
    if not cli:
        pytest.skip("FERRY_CLI is not set")
    tensors = unaligned()
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode(tensors))
    runs = {}
    for route in ("read", "auto"):
        out = subprocess.run([cli, "load", str(path), "--host", "--json", "--checksum",
                              "--host-load", route], check=True, capture_output=True,
                             text=True).stdout
        runs[route] = json.loads(out)
    assert runs["auto"]["host_routes"][0]["path"] == "mapped"
    assert runs["read"]["host_routes"][0]["path"] == "read"
    assert ([t["sha256"] for t in runs["auto"]["tensor_list"]]
            == [t["sha256"] for t in runs["read"]["tensor_list"]])
    text = subprocess.run([cli, "load", str(path), "--host"], check=True, capture_output=True,
                          text=True).stdout
    assert "host route: m.safetensors: mapped: resident in the page cache" in text


# --------------------------------------------------------------------------------- torch


def test_torch_tensors_are_views_of_the_mapping_and_match_the_read_route(tmp_path):
    torch = pytest.importorskip("torch")
    from ferry.safetensors.torch import load_file
    tensors = [t for t in every_dtype() + unaligned()[1:]
               if getattr(torch, ferry.checkpoint._DTYPES[t[1]].torch, None) is not None]
    tensors = [(f"{i}.{t[0]}",) + t[1:] for i, t in enumerate(tensors)]
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode(tensors))
    mapped = load_file(path)
    (route,) = ferry.last_load_report().host_routes
    assert route.path == "mapped"
    read = ferry.load_checkpoint(path, host_load="read")
    for name, t in mapped.items():
        assert t.dtype == read[name].dtype and t.shape == read[name].shape, name
        assert t.view(-1).view(torch.uint8).numpy().tobytes() == \
            read[name].view(-1).view(torch.uint8).numpy().tobytes(), name
    before = path.read_bytes()
    biggest = max(mapped, key=lambda n: mapped[n].numel() * mapped[n].element_size())
    mapped[biggest].zero_()  # copy-on-write
    assert path.read_bytes() == before
    os.remove(path)
    del read
    gc.collect()
    for name, dtype, shape, data in tensors:  # still there once the file is gone
        if name != biggest and dtype not in PACKED:
            assert mapped[name].reshape(-1).view(torch.uint8).numpy().tobytes() == data, name


def _mapping_facts(address: int) -> dict:
    """Size and Rss (KiB) and VmFlags of the mapping of this process that holds `address`."""
    facts, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(" ", 1)[0]
            if "-" in head and ":" not in head:
                if inside:
                    break
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith(("Size:", "Rss:")):
                facts[line.split(":")[0]] = int(line.split()[1])
            elif inside and line.startswith("VmFlags:"):
                facts["VmFlags"] = line.split(":", 1)[1].strip()
    return facts


def test_torch_load_file_of_a_resident_file_maps_under_auto_as_under_map(tmp_path):
    # The H100's "auto 0.55x of map" on a resident file was the bench's first process reading
    # torch's code from disk (bench/NOTES.md §47): both modes must stay one lazy mapping with the
    # same advice, nothing faulted in before the load returns, as safetensors' is.
    torch = pytest.importorskip("torch")
    from ferry.safetensors.torch import load_file
    big = rng_bytes(4 << 20, 7)
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode([("big", "U8", (len(big),), big)] + unaligned()))
    path.read_bytes()  # every page cached
    loads, facts = {}, {}
    for mode in ("map", "auto"):
        with ferry.settings(host_load=mode):
            loads[mode] = load_file(path)
        (route,) = ferry.last_load_report().host_routes
        if mode == "auto" and route.page_cache.fraction < 0.9:
            pytest.skip(f"the file did not stay resident: {route.reason}")
        assert route.path == "mapped", (mode, route.reason)
        facts[mode] = _mapping_facts(loads[mode]["big"].data_ptr())
    assert facts["auto"]["VmFlags"] == facts["map"]["VmFlags"]
    assert facts["auto"]["Size"] == facts["map"]["Size"] >= 4 << 10
    assert facts["auto"]["Rss"] == facts["map"]["Rss"] == 0, facts
    assert int(loads["auto"]["big"][::4096].sum()) == sum(big[::4096])
    assert _mapping_facts(loads["auto"]["big"].data_ptr())["Rss"] > 0  # the check sees faults


@pytest.mark.gpu
def test_a_gpu_load_of_a_resident_file_is_read_as_before(torch, tmp_path):
    # The host route is for pageable host memory only: a GPU load has none, and reads.
    tensors = unaligned()[:4]  # random bits: NaNs among them, so bytes are compared
    path = tmp_path / "m.safetensors"
    path.write_bytes(encode(tensors))
    on_gpu = ferry.load_checkpoint(path, device="cuda:0", framework="pt")
    report = ferry.last_load_report()
    assert report.host_routes == [] and len(report.routes) == 1
    on_host = ferry.load_checkpoint(path, framework="pt")
    assert ferry.last_load_report().host_routes[0].path == "mapped"
    for name, t in on_gpu.items():
        assert t.is_cuda and torch.equal(t.cpu().reshape(-1).view(torch.uint8),
                                         on_host[name].reshape(-1).view(torch.uint8)), name
