"""SandboxFusion's evaluation classes, one module per family (see :mod:`mocksandbox.datasets.kinds`)."""

from __future__ import annotations

from mocksandbox.datasets.classes.autoeval import AutoEvalDataset
from mocksandbox.datasets.classes.common_oj import CommonOJDataset
from mocksandbox.datasets.classes.cruxeval import CruxEvalDataset
from mocksandbox.datasets.classes.humaneval import EvoEvalDataset, HumanEvalDataset, MultiPLEDataset
from mocksandbox.datasets.classes.live_code_bench import LiveCodeBenchDataset
from mocksandbox.datasets.classes.mbpp import MBPPDataset
from mocksandbox.datasets.classes.mbxp import MBXPDataset
from mocksandbox.datasets.classes.minif2f import MiniF2FLean4Dataset
from mocksandbox.datasets.classes.repobench import RepobenchCDataset, RepobenchPDataset
from mocksandbox.datasets.classes.small import (
    AiderBenchmarkDataset,
    MHPPDataset,
    NaturalCodeBenchDataset,
    PalMathDataset,
)
from mocksandbox.datasets.classes.verilog import VerilogDataset
from mocksandbox.datasets.kinds import DatasetClass


def all_classes() -> list[DatasetClass]:
    """One instance of every class, in the order of SandboxFusion's registry (its
    ``/list_datasets`` lists ids in this order)."""
    return [
        AiderBenchmarkDataset(),
        AutoEvalDataset(),
        CommonOJDataset(),
        CruxEvalDataset(),
        MultiPLEDataset(),
        HumanEvalDataset(),
        EvoEvalDataset(),
        LiveCodeBenchDataset(),
        MBPPDataset(),
        MBXPDataset(),
        MHPPDataset(),
        MiniF2FLean4Dataset(),
        NaturalCodeBenchDataset(),
        PalMathDataset(),
        RepobenchCDataset(),
        RepobenchPDataset(),
        VerilogDataset(),
    ]


__all__ = ["DatasetClass", "all_classes"]
