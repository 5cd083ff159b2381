"""The ferry CLI's reports are as short as their content: each fact said once, one unit per
quantity (GB/s for rates, CPU-s/GiB for CPU, binary units for sizes), nothing that cannot
matter to the request, and each shard named above its route."""

import json
import os
import re
import struct
import subprocess
import sys

import numpy as np
import pytest

CLI = os.environ.get("FERRY_CLI")
pytestmark = pytest.mark.skipif(not CLI, reason="FERRY_CLI (the built ferry tool) is not set")


def ferry(*args, env=None):
    return subprocess.run([CLI, *map(str, args)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def data(tmp_path):
    p = tmp_path / "data.bin"
    p.write_bytes(os.urandom(1 << 20))
    return p


def test_a_host_read_says_why_there_is_no_driver_once(data):
    for args in ([data], [data, "--host"]):
        done = ferry("read", *args)
        assert done.returncode == 0, done.stderr
        out = done.stdout + done.stderr
        assert out.count("no CUDA driver") <= 1, out
        assert out.count("cuFile serves GPU memory") <= 1, out


def test_rates_in_gb_per_s_and_cpu_in_cpu_seconds_per_gib_whatever_the_size(data):
    out = ferry("read", data, "--host").stdout
    assert re.search(r"GB/s, [0-9.]+ CPU-s/GiB", out), out
    assert "us of CPU" not in out and "GiB/s" not in out and "MiB/s" not in out


def test_explain_for_host_memory_lists_no_nvidia_fs_blockers(data):
    done = ferry("explain", data, "--host", "--json")
    assert done.returncode == 0, done.stderr
    e = json.loads(done.stdout)
    assert e["layer1"]["path"] == "posix"
    assert e["layer2"]["blocking"] == [], e["layer2"]
    assert "blocks nvidia-fs" not in ferry("explain", data, "--host").stdout


def shard(path, name, values):
    head = json.dumps({name: {"dtype": "F32", "shape": [values.size],
                              "data_offsets": [0, values.nbytes]}}).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + values.tobytes())


def test_a_load_of_several_shards_names_each_above_its_route(tmp_path):
    names = []
    for i in range(3):
        names.append(f"model-0000{i + 1}-of-00003.safetensors")
        shard(tmp_path / names[-1], f"w{i}", np.arange(1024, dtype=np.float32) + i)
    index = {"metadata": {}, "weight_map": {f"w{i}": names[i] for i in range(3)}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    # Read: resident, the shards would be mapped, without a request to name.
    done = ferry("load", tmp_path / "model.safetensors.index.json", "--host", "--host-load", "read")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("shard ")]
    assert len(heads) == 3, done.stdout
    for k, i in enumerate(heads):
        assert lines[i].startswith(f"shard {k + 1} of 3: "), lines[i]
        assert lines[i].endswith(".safetensors"), lines[i]
        assert lines[i + 1].startswith("route: "), done.stdout
    # One shard: no heading, the route is the load's.
    one = ferry("load", tmp_path / names[0], "--host").stdout
    assert not any(line.startswith("shard ") for line in one.splitlines()), one


def test_stats_all_prints_sizes_in_binary_units_not_exponents(tmp_path, data):
    """A process that has read 2 GiB: '2.00 GiB', not '2.05e+03 MiB'."""
    code = ("import ferry, numpy as np, sys, time\n"
            "a = np.empty(1 << 20, np.uint8)\n"
            "with ferry.open(sys.argv[1]) as f:\n"
            "    for _ in range(2048): f.read(a)\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")
    env = {**os.environ, "FERRY_STATS_DIR": str(tmp_path)}
    reader = subprocess.Popen([sys.executable, "-c", code, str(data)], stdout=subprocess.PIPE,
                              text=True, env=env)
    try:
        assert reader.stdout.readline().strip() == "ready"
        done = ferry("stats", "--all", env={"FERRY_STATS_DIR": str(tmp_path)})
        assert done.returncode == 0, done.stderr
        row = [line for line in done.stdout.splitlines() if line.split()[:1] == [str(reader.pid)]]
        assert row, done.stdout
        assert "2.00 GiB" in row[0], row[0]
        assert "e+" not in done.stdout, done.stdout
    finally:
        reader.kill()
        reader.wait()


def test_write_reports_its_fsync_apart_from_the_write_request(tmp_path):
    # The write request's rate is the page cache's; a durable file waits for the disk on top,
    # and the report says how long (a user read 4-5 GB/s "durably" off the request's rate).
    dest = tmp_path / "w.bin"
    done = ferry("write", dest, "--size", "1MiB", "--host", "--json")
    assert done.returncode == 0, done.stderr
    r = json.loads(done.stdout)
    assert r["synced"] is True and r["sync_seconds"] > 0, r
    assert 0 < r["durable_gbps"] < r["gbps"], r
    text = ferry("write", dest, "--size", "1MiB", "--host").stdout
    assert re.search(r"synced \(file and folder\) in [0-9.]+ s more: [0-9.]+ GB/s durable", text)
    assert "write-behind" in text, text  # its writeback started as it wrote, for the fsync
    r = json.loads(ferry("write", dest, "--size", "1MiB", "--host", "--no-sync", "--json").stdout)
    assert r["synced"] is False and r["sync_seconds"] == 0 and r["durable_gbps"] is None, r
    text = ferry("write", dest, "--size", "1MiB", "--host", "--no-sync").stdout
    assert "durable" not in text and "write-behind" not in text, text
