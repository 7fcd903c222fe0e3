"""Which class evaluates which dataset id, and which table holds its rows.

SandboxFusion's registry (its ``local.yaml``) lists each class with the dataset ids it serves and
their tables (``evoeval`` → ``code_eval_EvoEval``); an id it does not list is served by the class
named in ``config.dataset_type``, from table ``code_eval_<id>``. ``/list_datasets`` lists the
registered ids in registry order, whether their tables are loaded or not.

The mock adds one thing: a loaded table ``code_eval_<id>`` (or ``<id>``) whose id nobody registers,
and whose first row has the shape of an MBPP, HumanEval or online-judge row, is registered under
``<id>`` for that class, so a directory of such files needs no ``dataset_type``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from mocksandbox.datasets.classes import all_classes
from mocksandbox.datasets.errors import DatasetHTTPError
from mocksandbox.datasets.kinds import DatasetClass
from mocksandbox.datasets.models import TestConfig
from mocksandbox.datasets.tables import TableStore

#: The sample datasets: ``fixtures/datasets`` of the checkout, reached through the ``samples``
#: symlink beside this module, which wheels carry as a real directory.
SAMPLE_DATASETS_DIR = Path(__file__).resolve().parent / "samples"

TABLE_PREFIX = "code_eval_"

#: Classes whose rows are recognised in unregistered tables (their rows have distinctive columns).
_INFERRED_CLASSES = ("MBPPDataset", "HumanEvalDataset", "CommonOJDataset")


def table_name(dataset: str) -> str:
    """SandboxFusion's default table for ``dataset``."""
    return f"{TABLE_PREFIX}{dataset}"


class DatasetRegistry:
    """Dataset ids, their classes and their tables; read-only once built."""

    def __init__(self, tables: TableStore, classes: Sequence[DatasetClass] | None = None) -> None:
        self.tables = tables
        self.classes: dict[str, DatasetClass] = {c.class_name: c for c in classes or all_classes()}
        # First class listing an id wins, as SandboxFusion's lookup.
        self.registered: dict[str, DatasetClass] = {}
        for cls in self.classes.values():
            for dataset in cls.dataset_tables:
                self.registered.setdefault(dataset, cls)
        self.inferred: dict[str, tuple[DatasetClass, str]] = {}
        claimed = {table for cls in self.classes.values() for table in cls.dataset_tables.values()}
        for table in sorted(tables.table_names()):
            dataset = table.removeprefix(TABLE_PREFIX)
            if table in claimed or dataset in self.registered or dataset in self.inferred:
                continue
            shaped = self._shape_of(table)
            if shaped is not None:
                self.inferred[dataset] = (shaped, table)

    def _shape_of(self, table: str) -> DatasetClass | None:
        first = self.tables.first_row(table)
        if first is None:
            return None
        candidates = (self.classes[name] for name in _INFERRED_CLASSES if name in self.classes)
        return next((cls for cls in candidates if cls.matches(first)), None)

    def dataset_ids(self) -> list[str]:
        """What ``/list_datasets`` answers: registered ids in registry order, then inferred ones."""
        return [*self.registered, *sorted(self.inferred)]

    def class_for(self, dataset: str, config: TestConfig) -> DatasetClass:
        """The class for ``dataset``: registered, else ``config.dataset_type``; 400 otherwise."""
        registered = self.registered.get(dataset)
        if registered is not None:
            return registered
        if dataset in self.inferred:
            return self.inferred[dataset][0]
        if config.dataset_type is None:
            raise DatasetHTTPError(400, f"no eval class found for dataset {dataset}")
        named = self.classes.get(config.dataset_type)
        if named is None:
            raise DatasetHTTPError(400, f"eval class {config.dataset_type} not found")
        return named

    def table_for(self, cls: DatasetClass, dataset: str) -> str:
        """The table ``cls`` reads ``dataset`` from."""
        if dataset in cls.dataset_tables:
            return cls.dataset_tables[dataset]
        inferred = self.inferred.get(dataset)
        if inferred is not None and inferred[0] is cls:
            return inferred[1]
        default = table_name(dataset)
        # A file named `<id>.jsonl` serves `<id>` too (SandboxFusion only reads `code_eval_<id>`).
        if default not in self.tables.table_names() and dataset in self.tables.table_names():
            return dataset
        return default

    def loaded(self, cls: DatasetClass) -> list[str]:
        """Registered ids of ``cls`` whose table is loaded."""
        names = set(self.tables.table_names())
        return [dataset for dataset, table in cls.dataset_tables.items() if table in names]
