"""``mocksandbox rollout``: replay scripted tool-calling rollouts against a sandbox, no GPU.

Cheap to import: the server, the tools and the driver are imported inside the handler.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from typing import Any

EPILOG = """\
exit status: 0 every rollout ran (and matched its recorded one, where the script has one),
1 a rollout differs from its recording, 2 the run could not be made.

examples:
  mocksandbox rollout fixtures/rollouts/seed_sample.json
  mocksandbox rollout fixtures/rollouts/seed_sample.json --repeat 32 --rate-limit 4 --jsonl out.jsonl
  mocksandbox rollout my_script.json --url http://127.0.0.1:8080 --tool-config tools.yaml
"""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "rollout",
        help="replay scripted tool-calling rollouts (code_interpreter) against a sandbox",
        description="Replay rollout scripts (prompt turns + assistant turns, the format of "
        "fixtures/rollouts/*.json) through the code_interpreter tool and the multi-turn driver, "
        "against a sandbox URL or a mock started for the run; print each rollout's tool responses "
        "and score, and compare with the recorded rollout when the script has one.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("scripts", nargs="+", metavar="SCRIPT.json", help="rollout scripts to replay")
    parser.add_argument("--url", help="sandbox base URL (default: start a mock on 127.0.0.1 for the run)")
    parser.add_argument(
        "--tool-config", metavar="YAML", help="verl-style tool config (default: the seed's tool)"
    )
    parser.add_argument("--rate-limit", type=int, metavar="K", help="concurrent sandbox calls (default 10)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N", help="run each script N times at once")
    parser.add_argument("--max-turns", type=int, default=10, metavar="N", help="assistant turns (10)")
    parser.add_argument("--max-seq-len", type=int, default=8192, metavar="N", help="tokens (8192, estimated)")
    parser.add_argument(
        "--numeric", action="store_true", help="score GSM8K answers as numbers (220000.0 == 220000)"
    )
    parser.add_argument("--jsonl", metavar="FILE", help="write every record here (JSON Lines)")
    parser.set_defaults(handler=_rollout)


def _rollout(args: argparse.Namespace) -> int:
    from mocksandbox.tools.config import ToolConfigError, build_tools
    from mocksandbox.tools.rollout import RolloutDriver, RolloutScript, dump_jsonl
    from mocksandbox.tools.scoring import gsm8k_numeric_score, gsm8k_score

    if args.repeat < 1:
        print("mocksandbox rollout: --repeat must be at least 1", file=sys.stderr)
        return 2
    try:
        scripts = [(path, RolloutScript.load(path)) for path in args.scripts]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"mocksandbox rollout: cannot read a script: {exc}", file=sys.stderr)
        return 2
    server = sandbox = None
    url = args.url
    if url is None:
        from mocksandbox.core import MockSandbox
        from mocksandbox.serving.single import ServerThread
        from mocksandbox.settings import load_settings

        sandbox = MockSandbox.create(load_settings(None, overrides={"host": "127.0.0.1", "port": 0}))
        server = ServerThread(sandbox, "127.0.0.1", 0).start()
        url = server.url
        print(f"mocksandbox rollout: started a mock sandbox at {url}", flush=True)
    overrides: dict[str, Any] = {"sandbox_fusion_url": url}
    if args.rate_limit is not None:
        overrides["rate_limit"] = args.rate_limit
    failed = False
    records = []
    limiter_name: str | None = None
    try:
        if args.tool_config:
            tools = build_tools(args.tool_config, overrides)
        else:
            from mocksandbox.tools.code_interpreter import CodeInterpreterTool
            from mocksandbox.tools.config import ToolRegistry

            # A limiter of this run's own (the process-wide default may exist with another limit).
            limiter_name = f"mocksandbox-rollout-{uuid.uuid4().hex[:8]}"
            tools = ToolRegistry([CodeInterpreterTool({**overrides, "rate_limiter_name": limiter_name})])
        with tools:
            for path, script in scripts:
                driver = RolloutDriver(
                    tools,
                    max_turns=args.max_turns,
                    max_seq_len=args.max_seq_len,
                    scorer=gsm8k_numeric_score if args.numeric else gsm8k_score,
                    chat_format=script.chat_format,
                )
                batch = driver.run_sync([script.request(driver) for _ in range(args.repeat)])
                records.extend(batch)
                failed |= _report(path, script, batch, compare=not args.numeric)
    except ToolConfigError as exc:
        print(f"mocksandbox rollout: {exc}", file=sys.stderr)
        return 2
    finally:
        if limiter_name is not None:
            from mocksandbox.ratelimit import drop_shared_limiter

            drop_shared_limiter(limiter_name)
        if server is not None and sandbox is not None:
            stats = sandbox.stats()
            total, peak = stats["requests_total"], stats["max_in_flight"]
            print(f"mock sandbox: {total} request(s), at most {peak} at once")
            server.stop()
            sandbox.close()
    if args.jsonl:
        dump_jsonl(records, args.jsonl)
        print(f"wrote {len(records)} record(s) to {args.jsonl}")
    return 1 if failed else 0


def _report(path: str, script: Any, batch: list[Any], compare: bool) -> bool:
    """Print one line per rollout; True when one differs from the script's recorded rollout."""
    expected = script.expected.get("record") if compare else None
    differs = False
    for record in batch:
        line = (
            f"{path}: {record.turns} turn(s), stopped at {record.stop_reason}, score {record.score}, "
            f"tool responses {record.tool_responses!r}"
        )
        if expected is not None:
            same = (record.input, record.output, record.score, record.step) == (
                expected["input"],
                expected["output"],
                expected["score"],
                expected["step"],
            )
            differs |= not same
            line += ", matches the recorded rollout" if same else ", DIFFERS from the recorded rollout"
        print(line)
    return differs
