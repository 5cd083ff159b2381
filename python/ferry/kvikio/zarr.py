"""``kvikio.zarr``: KvikIO's Zarr store (GDSStore) and codecs are not in ferry.kvikio; every name
raises NotImplementedError. Read a Zarr chunk's bytes with ferry.read_into or CuFile.read."""

from ._missing import module_getattr

__getattr__ = module_getattr("kvikio.zarr", "no Zarr store: read chunk files with "
                             "ferry.kvikio.CuFile or ferry.read_into")
