"""``mocksandbox datasets``: the datasets ``serve`` would offer, each with its class and rows here,
and what this host lacks for some (the notes the verbose banner gives)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mocksandbox.datasets.service import DatasetService
    from mocksandbox.models import RunCodeRequest, RunCodeResponse


def register(subparsers: Any) -> None:
    datasets = subparsers.add_parser(
        "datasets",
        help="list the datasets serve would offer (or a deployment offers), with their classes and rows",
        description="The dataset ids /list_datasets answers, each with the class that evaluates it and "
        "how many rows are loaded here, then what this host lacks for some of them.",
    )
    datasets.add_argument("--config", metavar="FILE", help="settings file, as for serve")
    datasets.add_argument(
        "--datasets", action="append", metavar="DIR", help="directory of dataset JSONL files, as for serve"
    )
    datasets.add_argument("--dataset-assets", metavar="DIR", help="SandboxFusion's assets/ dir, as for serve")
    datasets.add_argument("--url", help="ask this deployment's /list_datasets instead")
    datasets.set_defaults(handler=_datasets)


class _NoRunner:
    """Listing runs no program."""

    def run_code(self, request: RunCodeRequest) -> RunCodeResponse:
        raise RuntimeError("mocksandbox datasets runs no program")


def describe_datasets(service: DatasetService) -> list[str]:
    """A table of the datasets ``service`` offers (id, class, rows here), then its notes."""
    registry = service.registry
    loaded = set(registry.tables.table_names())
    rows = []
    for dataset in registry.dataset_ids():
        cls = registry.registered.get(dataset) or registry.inferred[dataset][0]
        table = registry.table_for(cls, dataset)
        count = f"{registry.tables.size(table)} rows" if table in loaded else "no rows here"
        rows.append((dataset, cls.class_name, count))
    width = max((len(row[0]) for row in rows), default=7)
    class_width = max((len(row[1]) for row in rows), default=5)
    lines = [f"{'dataset'.ljust(width)}  {'class'.ljust(class_width)}  here"]
    lines += [f"{dataset.ljust(width)}  {name.ljust(class_width)}  {count}" for dataset, name, count in rows]
    with_rows = sum(count != "no rows here" for _, _, count in rows)
    lines.append(
        f"{len(rows)} datasets, {with_rows} with rows here (the rest answer as SandboxFusion without "
        "its database: serve --datasets DIR adds code_eval_<id>.jsonl files)"
    )
    lines += [f"note: {note}" for note in service.startup_notes()]
    return lines


def _datasets(args: argparse.Namespace) -> int:
    if args.url:
        import requests

        try:
            answer = requests.get(f"{args.url.rstrip('/')}/list_datasets", timeout=60)
        except requests.RequestException as exc:
            print(f"mocksandbox datasets: cannot reach {args.url}: {exc}", file=sys.stderr)
            return 1
        if answer.status_code != 200:
            print(f"mocksandbox datasets: {args.url} answered {answer.status_code}", file=sys.stderr)
            return 1
        ids = answer.json()
        print("\n".join(ids))
        print(f"{len(ids)} datasets at {args.url}")
        return 0
    from mocksandbox.datasets.errors import DatasetLoadError
    from mocksandbox.datasets.service import DatasetService
    from mocksandbox.settings import SettingsError, load_settings

    overrides = {"datasets_dirs": args.datasets, "dataset_assets_dir": args.dataset_assets}
    try:
        settings = load_settings(args.config, overrides=overrides)
        service = DatasetService.from_settings(settings, _NoRunner())
    except (SettingsError, DatasetLoadError) as exc:
        print(f"mocksandbox datasets: {exc}", file=sys.stderr)
        return 2
    print("\n".join(describe_datasets(service)))
    return 0
