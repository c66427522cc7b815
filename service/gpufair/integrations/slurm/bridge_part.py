"""What each part of a bridge cycle works with (node_sync.py, placement.py, reconcile.py): the
ones the Bridge (bridge.py) is made with and hands to each part it holds."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpufair.client import GpufairClient
from gpufair.integrations.slurm.config import BridgeConfig
from gpufair.integrations.slurm.slurmctl import SlurmCtl


@dataclass(eq=False)
class BridgePart:
    config: BridgeConfig
    client: GpufairClient
    slurm: SlurmCtl
    clock: Callable[[], float]
