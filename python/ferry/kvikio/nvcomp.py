"""``kvikio.nvcomp``: nvCOMP compression is not in ferry.kvikio; every name raises
NotImplementedError."""

from ._missing import module_getattr

__getattr__ = module_getattr("kvikio.nvcomp", "no nvCOMP: ferry moves bytes, it does not "
                             "compress them")
