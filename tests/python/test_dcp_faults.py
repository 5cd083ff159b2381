"""Issue 51 item 4 on torch 2.x (the GPU machine; CI's torch 1.13 lacks DCP and skips this file,
saying so): two gloo ranks save through ferry.dcp.FileSystemWriter over an old checkpoint, each
rank a process of its own with tests/checkpoint/save_fault_shim.cc preloaded, which kills it
(SIGKILL) or fails a system call (EIO, ENOSPC) at a chosen call of the save protocol (pwrite,
fsync, rename, unlink, mkdir...). After every fault, stock dcp.load with stock FileSystemReader
reads the folder as exactly the old checkpoint or exactly the new one, never a mix; a save that
reported success is the new one; the next save succeeds and leaves no temporary file. The C++
core has the full walk in CI (save_fault_tests: DcpSaveUnderFaults); this is the same protocol
driven by torch's own DCP through ferry's writer, ranks and all.

Needs the shim: FERRY_SAVE_FAULT_SHIM, or build/tests/checkpoint/libsave_fault_shim.so (or under
FERRY_BUILD_DIR)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
try:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader as StockReader
except Exception as e:  # torch 1.x; torch.distributed._shard on Python 3.11
    pytest.skip(f"needs torch.distributed.checkpoint (torch 2.x); torch {torch.__version__}: {e}",
                allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]


def _shim():
    given = os.environ.get("FERRY_SAVE_FAULT_SHIM")
    if given:
        return Path(given)
    for build in (os.environ.get("FERRY_BUILD_DIR"), REPO / "build", "/tmp/ferry-gpu-build"):
        if build and (Path(build) / "tests/checkpoint/libsave_fault_shim.so").exists():
            return Path(build) / "tests/checkpoint/libsave_fault_shim.so"
    return None


SHIM = _shim()
if SHIM is None:
    pytest.skip("the save fault shim is not built (save_fault_shim target; FERRY_SAVE_FAULT_SHIM)",
                allow_module_level=True)

# One rank of a 2-rank save of generation GEN: a replicated tensor (the coordinator writes it),
# one of the rank's own, 1 MiB each (several pwrites), and a byte item.
RANK = r"""
import datetime, sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import ferry.dcp
rank, path, init, gen = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=30))
sd = {"shared": torch.full((512, 512), float(gen)),
      f"rank{rank}": torch.full((256, 1024), float(gen) + rank),
      "step": gen}
try:
    dcp.save(sd, storage_writer=ferry.dcp.FileSystemWriter(path))
finally:
    dist.destroy_process_group()
"""


def _save(tmp_path, path, gen, fault=None, count_prefix=None):
    """Runs both ranks; returns their exit codes and output."""
    init = f"file://{tmp_path / f'store-{os.urandom(6).hex()}'}"
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, PYTHONPATH=str(REPO / "python"), PYTHONDONTWRITEBYTECODE="1")
        if fault or count_prefix:
            env.update(LD_PRELOAD=str(SHIM), FERRY_FAULT=fault or "",
                       FERRY_FAULT_COUNT=f"{count_prefix}.{rank}" if count_prefix else "")
        procs.append(subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(path), init,
                                       str(gen)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    codes, output = [], ""
    for p in procs:
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        codes.append(p.returncode)
        output += out[-2000:]
    return codes, output


def _generation(path):
    """The generation stock dcp.load reads from `path`, asserting it is one generation whole."""
    sd = {"shared": torch.zeros(512, 512), "rank0": torch.zeros(256, 1024),
          "rank1": torch.zeros(256, 1024), "step": -1}
    dcp.load(sd, storage_reader=StockReader(path), no_dist=True)
    gen = sd["step"]
    assert torch.equal(sd["shared"], torch.full((512, 512), float(gen))), "shared is mixed"
    for rank in (0, 1):
        assert torch.equal(sd[f"rank{rank}"], torch.full((256, 1024), float(gen) + rank)), \
            f"rank{rank}'s tensor is not generation {gen}'s"
    return gen


def _counts(prefix):
    counts = {}
    for rank in (0, 1):
        for line in Path(f"{prefix}.{rank}").read_text().splitlines():
            op, _, n = line.partition(" ")
            if op != "fsync_dir" or n.isdigit():
                counts[op] = max(counts.get(op, 0), int(n))
    return {op: n for op, n in counts.items() if n > 0 and op != "umask"}


def test_every_step_of_a_two_rank_save_killed_or_failed_leaves_the_old_checkpoint_or_the_new(
        tmp_path):
    path = tmp_path / "ckpt"
    codes, out = _save(tmp_path, path, 1)
    assert codes == [0, 0], out
    assert _generation(path) == 1
    codes, out = _save(tmp_path, path, 2, count_prefix=tmp_path / "counts")
    assert codes == [0, 0], out
    assert _generation(path) == 2
    counts = _counts(tmp_path / "counts")
    assert counts.get("pwrite", 0) > 0 and counts.get("rename", 0) > 0, counts
    # Each system call of the protocol: its first call killed, its last failed with EIO; the
    # data's pwrites also run out of space midway.
    steps = [(op, 1, "kill") for op in counts] + [(op, n, "EIO") for op, n in counts.items()]
    steps.append(("pwrite", max(1, counts["pwrite"] // 2), "ENOSPC"))
    outcomes = []
    for gen, (op, n, action) in enumerate(steps, start=3):
        fault = f"{op}:{n}:{action}"
        old = _generation(path)
        codes, out = _save(tmp_path, path, gen, fault=fault)
        now = _generation(path)
        assert now in (old, gen), f"{fault}: loads as generation {now}, not {old} or {gen}"
        if codes == [0, 0]:
            assert now == gen, f"{fault}: both ranks reported success, the old checkpoint stays"
        outcomes.append((fault, codes, now == gen))
    assert any(not new for _, _, new in outcomes), outcomes  # some fault did stop a save
    final = len(steps) + 3
    codes, out = _save(tmp_path, path, final)
    assert codes == [0, 0], out
    assert _generation(path) == final
    names = sorted(p.name for p in path.iterdir())
    assert not [n for n in names if ".ferry-" in n], names
    assert sum(n.endswith(".distcp") for n in names) == 2, names
