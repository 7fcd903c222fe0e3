"""``mocksandbox contract``: run the shipped contract suite, or compare two deployments."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from mocksandbox.extras import require

#: Exit code when --docker was asked for but no Docker engine is reachable.
EXIT_NO_DOCKER = 3

SUITE_DIR = Path(__file__).resolve().parent / "suite"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "contract",
        help="check a SandboxFusion/swedev deployment (or the mock) against the contract",
        description=(
            "Run the contract suite against --url (or a mock it starts), compare two deployments "
            "with --reference-url, or start the official image with --docker."
        ),
    )
    parser.add_argument("--url", help="base URL of the deployment to check (default: start the mock)")
    parser.add_argument("--junit", metavar="FILE", help="write a JUnit XML report")
    parser.add_argument("--thorough", action="store_true", help="many more generated programs")
    parser.add_argument(
        "--reference-url",
        metavar="URL",
        help="differential mode: send the corpus and generated cases to --url and this URL, show differences",
    )
    parser.add_argument(
        "--generated", type=int, default=40, metavar="N", help="generated cases (differential)"
    )
    parser.add_argument(
        "--docker",
        nargs="?",
        const="volcengine/sandbox-fusion:server-20241204",
        metavar="IMAGE",
        help="start this image (default: the official one) with the docker SDK and check it",
    )
    parser.add_argument(
        "--cassette",
        metavar="FILE",
        help="drift check: send a cassette's requests to --url, list what changed (exit 1 if anything)",
    )
    parser.add_argument("pytest_args", nargs="*", help="extra arguments for pytest (after --)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.cassette:
        if not args.url:
            print("mocksandbox contract: --cassette needs --url (the deployment to check)", file=sys.stderr)
            return 2
        return _drift(args.cassette, args.url)
    if args.reference_url:
        if not args.url:
            print(
                "mocksandbox contract: --reference-url needs --url (the deployment to compare)",
                file=sys.stderr,
            )
            return 2
        return _differential(args.url, args.reference_url, args.generated)
    # The suite runs under pytest with hypothesis (the `contract` extra); --docker needs the SDK
    # (checked where the client is made).
    require("'mocksandbox contract'", "pytest", "hypothesis")
    if args.docker:
        from mocksandbox.contract.docker_launcher import NoDockerEngine, running_image

        try:
            with running_image(args.docker) as url:
                print(f"mocksandbox contract: {args.docker} is up at {url}", flush=True)
                return run_suite(url, args.junit, args.thorough, args.pytest_args)
        except NoDockerEngine as exc:
            print(f"mocksandbox contract: {exc}", file=sys.stderr)
            return EXIT_NO_DOCKER
        except TimeoutError as exc:
            print(f"mocksandbox contract: {exc}", file=sys.stderr)
            return 2
    return run_suite(args.url, args.junit, args.thorough, args.pytest_args)


def run_suite(url: str | None, junit: str | None, thorough: bool, extra: list[str]) -> int:
    """pytest over the shipped suite; its exit code."""
    import pytest

    argv = [str(SUITE_DIR), "-p", "no:cacheprovider", "-q", "--rootdir", str(SUITE_DIR)]
    if url:
        argv += ["--sandbox-url", url]
    if junit:
        argv += ["--junitxml", junit]
    if thorough:
        argv.append("--contract-thorough")
    return int(pytest.main([*argv, *extra]))


def _differential(url: str, reference_url: str, generated: int) -> int:
    from mocksandbox.contract.differential import compare, corpus_cases, format_table, generated_cases

    cases = corpus_cases() + generated_cases(generated)

    def progress(done: int, total: int) -> None:
        if done == total or done % 10 == 0:
            print(f"\r  {done}/{total} cases", end="" if done < total else "\n", file=sys.stderr, flush=True)

    differences = compare(url, reference_url, cases, progress=progress)
    for line in format_table(differences, len(cases)):
        print(line)
    return 1 if differences else 0


def _drift(cassette: str, url: str) -> int:
    from mocksandbox.recording.cassette import CassetteError, read_cassette
    from mocksandbox.recording.drift import check, format_table

    try:
        exchanges = read_cassette(cassette)
    except CassetteError as exc:
        print(f"mocksandbox contract: {exc}", file=sys.stderr)
        return 2
    drifts = check(exchanges, url)
    for line in format_table(drifts, len(exchanges)):
        print(line)
    return 1 if drifts else 0
