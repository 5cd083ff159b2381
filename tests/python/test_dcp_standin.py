"""ferry.dcp's writer and reader where torch.distributed.checkpoint is absent (CI's torch 1.13):
a child process registers stand-ins for the names ferry.dcp imports from DCP (dataclasses of the
same fields as torch 2.x's) and drives FileSystemWriter (prepare_global_plan, write_data with a
progress callback, finish: the commit and last_report) and FileSystemReader.read_data (a bf16
tensor read into a float32 target, a transposed target, an int64 one, then a column region of a
saved chunk) as dcp.save and dcp.load would. It checks ferry's own logic on every CI run; the
real torch 2.11 API is tests/python/test_dcp_stock.py's, on the GPU machine. The stand-ins live in
the child only, so no other test sees them."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

CHILD = r'''
import dataclasses, enum, io, sys, types, os, tempfile, pickle
import torch
from torch.futures import Future

def mod(name, **attrs):
    m = types.ModuleType(name); m.__dict__.update(attrs); sys.modules[name] = m; return m

@dataclasses.dataclass
class _StorageInfo:
    relative_path: str; offset: int; length: int
    transform_descriptors: object = None
@dataclasses.dataclass(frozen=True)
class MetadataIndex:
    fqn: str; offset: tuple = None; index: int = None
@dataclasses.dataclass
class StorageMeta:
    checkpoint_id: object = None; save_id: str = ""; load_id: str = ""
@dataclasses.dataclass
class TensorProperties:
    dtype: torch.dtype
@dataclasses.dataclass
class ChunkStorageMetadata:
    offsets: torch.Size; sizes: torch.Size
@dataclasses.dataclass
class TensorStorageMetadata:
    properties: TensorProperties; size: torch.Size; chunks: list
@dataclasses.dataclass
class Metadata:
    state_dict_metadata: dict; planner_data: object = None; storage_data: object = None; storage_meta: object = None
class WriteItemType(enum.Enum):
    TENSOR = 0; SHARD = 1; BYTE_IO = 2
class LoadItemType(enum.Enum):
    TENSOR = 0; BYTE_IO = 1
@dataclasses.dataclass
class WriteItem:
    index: MetadataIndex; type: WriteItemType
@dataclasses.dataclass
class WriteResult:
    index: MetadataIndex; size_in_bytes: int; storage_data: object
@dataclasses.dataclass
class SavePlan:
    items: list; storage_data: object = None; planner_data: object = None
@dataclasses.dataclass
class LoadPlan:
    items: list; storage_data: object = None; planner_data: object = None
@dataclasses.dataclass
class ReadItem:
    type: LoadItemType; dest_index: MetadataIndex; dest_offsets: torch.Size; storage_index: MetadataIndex; storage_offsets: torch.Size; lengths: torch.Size
class StorageWriter: pass
class SavePlanner: pass
class LoadPlanner: pass
class AsyncStager: pass
class FileSystem:
    @staticmethod
    def validate_checkpoint_id(c): return True
class StockReader:
    def __init__(self, path): self.path = path; self.load_id = "L"
    def set_up_storage_reader(self, metadata, is_coordinator, *a, **k): self.storage_data = metadata.storage_data
    def read_data(self, plan, planner):
        raise AssertionError("stock read_data called for " + str([i.storage_index.fqn for i in plan.items]))
mod("torch.distributed.checkpoint")
mod("torch.distributed.checkpoint.filesystem", FileSystem=FileSystem, FileSystemReader=StockReader, _StorageInfo=_StorageInfo)
mod("torch.distributed.checkpoint.metadata", Metadata=Metadata, StorageMeta=StorageMeta, TensorStorageMetadata=TensorStorageMetadata)
mod("torch.distributed.checkpoint.planner", LoadItemType=LoadItemType, LoadPlan=LoadPlan, LoadPlanner=LoadPlanner, SavePlan=SavePlan, SavePlanner=SavePlanner, WriteItemType=WriteItemType)
mod("torch.distributed.checkpoint.staging", AsyncStager=AsyncStager)
mod("torch.distributed.checkpoint.storage", StorageWriter=StorageWriter, WriteResult=WriteResult)
mod("torch.distributed.checkpoint.state_dict_saver")
import ferry.dcp as fd

sd = {"a": torch.randn(8, 6).to(torch.bfloat16), "b": torch.randn(6, 8), "c": torch.arange(10)}
class Planner(SavePlanner):
    def resolve_data(self, item): return sd[item.index.fqn]
d = tempfile.mkdtemp()
seen = []
w = fd.FileSystemWriter(d, progress=lambda done, total: seen.append((done, total)))
w.set_up_storage_writer(True)
items = [WriteItem(MetadataIndex(k, (0,) * sd[k].dim()), WriteItemType.TENSOR) for k in sd]
plans = w.prepare_global_plan([w.prepare_local_plan(SavePlan(items))])
results = w.write_data(plans[0], Planner()).wait()
print("after write:", w.last_report.summary())
md = Metadata({k: TensorStorageMetadata(TensorProperties(v.dtype), v.shape, [ChunkStorageMetadata(torch.Size([0] * v.dim()), v.shape)]) for k, v in sd.items()})
w.finish(md, [results])
print("after finish:", w.last_report.summary(), w.last_report.committed, w.last_report.fsyncs, seen[-1])
# The reader, with a planner that resolves into fresh targets (one cast, one transposed).
r = fd.FileSystemReader(d)
meta = pickle.load(open(os.path.join(d, ".metadata"), "rb"))
r.set_up_storage_reader(meta, True)
targets = {"a": torch.zeros(8, 6), "b": torch.zeros(8, 6).t(), "c": torch.zeros(10, dtype=torch.int64)}
class LP(LoadPlanner):
    def resolve_tensor(self, req): return targets[req.dest_index.fqn]
    def commit_tensor(self, req, t): pass
reads = [ReadItem(LoadItemType.TENSOR, MetadataIndex(k, (0,) * sd[k].dim()), torch.Size([0] * sd[k].dim()),
                  MetadataIndex(k, (0,) * sd[k].dim()), torch.Size([0] * sd[k].dim()), sd[k].shape) for k in sd]
r.read_data(LoadPlan(reads), LP()).wait()
assert torch.equal(targets["a"], sd["a"].float()), "a"
assert torch.equal(targets["b"], sd["b"]), "b"
assert torch.equal(targets["c"], sd["c"]), "c"
print("reader ok:", r.last_report.tensors, r.last_report.bytes)
# A region: the second half of b's columns.
half = torch.zeros(6, 4)
class LP2(LP):
    def resolve_tensor(self, req): return half
r.read_data(LoadPlan([ReadItem(LoadItemType.TENSOR, MetadataIndex("b"), torch.Size([0, 0]), MetadataIndex("b", (0, 0)), torch.Size([0, 4]), torch.Size([6, 4]))]), LP2()).wait()
assert torch.equal(half, sd["b"][:, 4:]); print("region ok")
'''


def test_writer_and_reader_logic_through_stand_ins_for_dcp():
    # The parent's path: the tree's ferry, or the installed one under FERRY_EXPECT_INSTALLED.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("after write: 3 tensor(s),") and "2 fsync(s)" in lines[0], lines
    assert "committed by renaming" in lines[1] and "4 fsync(s)" in lines[1], lines
    assert lines[2].startswith("reader ok: 3 ") and lines[3] == "region ok", lines
