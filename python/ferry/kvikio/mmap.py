"""``kvikio.mmap``: KvikIO's memory-mapped reader (Mmap) is not in ferry.kvikio; every name
raises NotImplementedError."""

from ._missing import module_getattr

__getattr__ = module_getattr("kvikio.mmap", "no Mmap: read ranges with CuFile.pread")
