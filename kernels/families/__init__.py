"""The optimization ladder, one family per rung (rasterization is the RASTER parameter of rungs 4-8)."""
from kernels.space import ConfigError, Family
from kernels.families.blocktile1d import BlockTile1D
from kernels.families.blocktile2d import BlockTile2D
from kernels.families.f16x3 import F16x3
from kernels.families.naive import Naive
from kernels.families.pipelined import Pipelined, SplitK
from kernels.families.skinny import Skinny
from kernels.families.smem import SharedMemory
from kernels.families.tf32x3 import Tf32x3
from kernels.families.vectorized import Vectorized
from kernels.families.warptile import WarpTile
from kernels.families.wgmma import Wgmma

LADDER = (Naive(), SharedMemory(), BlockTile1D(), BlockTile2D(), Vectorized(), WarpTile(), Pipelined(), SplitK(),
          Tf32x3(), Skinny(), Wgmma(), F16x3())

FAMILIES: dict[str, Family] = {f.name: f for f in LADDER}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise ConfigError(f"unknown kernel family {name!r}; known families: {', '.join(FAMILIES)}") from None
