"""What the Hopper families (wgmma, f16x3) share: sm_90a only, one producer warpgroup beside WGS
consumer warpgroups, and the registers the consumers may take after setmaxnreg."""
from kernels.space import Config, Family, Param

# Registers a consumer thread may hold after setmaxnreg (CONSUMER_REGS in wgmma.cu and
# f16x3.cu: 128 x 40 + 256 x 232 and 128 x 40 + 384 x 152 fit 64 K registers; one consumer
# warpgroup keeps the 255 cap of a 256-thread block).
CONSUMER_REGS = {1: 255, 2: 232, 3: 152}

# Parameters both families have, with one meaning.
WGS = Param("WGS", (1, 2, 3), "consumer warpgroups (a producer warpgroup comes on top)")
STAGES = Param("STAGES", (2, 3, 4, 5, 6), "shared-memory stages in the TMA ring")
SPLITK = Param("SPLITK", (1, 2, 4, 8, 16), "slices of K (blockIdx.z), reduced by a second kernel", launch_time=True,
               sums=True)


class HopperFamily(Family):
    architectures = ("sm_90",)
    architecture_reason = "wgmma, the bulk tensor copy engine and setmaxnreg are Hopper (sm_90a) instructions"
    # A sequence of two to four short kernels: each starts while the one before it ends
    # (docs/kernels.md, "Launches that overlap their predecessor").
    follows_previous = True

    def target(self, arch: str) -> str:
        return "sm_90a" if arch == "sm_90" else arch

    def threads(self, c: Config) -> int:
        return 128 * (c["WGS"] + 1)

    def stage_bytes(self, c: Config) -> int:
        """Shared memory of one stage of the TMA ring."""
        raise NotImplementedError

    def shared_bytes(self, c: Config) -> int:
        # 1 KiB of slack to align the swizzled tiles, and two mbarriers per stage.
        return c["STAGES"] * self.stage_bytes(c) + 1024 + 16 * c["STAGES"]

    def splits(self, c: Config) -> int:
        return c["SPLITK"]
