"""``tensorboard-gradients diagnose LOGDIR``: the alerts of a logdir, without a browser.

    tensorboard-gradients diagnose runs/ [--run R] [--tag T] [--json]
        [--fail-on nonfinite,exploding] [--threshold exploding_norm=100 ...]

Prints one line per alert (or a JSON document with ``--json``) and exits with status 1 when an
alert of a ``--fail-on`` kind was found, so a training pipeline can gate on it. Status 2: bad
arguments or an unreadable logdir. Rules and defaults: `tensorboard_gradients.analysis`.
"""

import argparse
import json
import math
import os
import sys
from typing import List, Optional

from tensorboard_gradients import analysis, metadata, reader


def _parser():
    parser = argparse.ArgumentParser(
        prog="tensorboard-gradients",
        description="Diagnose vanishing, exploding and non-finite gradients in a logdir.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    diagnose = commands.add_parser(
        "diagnose",
        help="print the gradient alerts of every run in LOGDIR",
        description="Print the gradient alerts of every run in LOGDIR (most severe first).",
    )
    diagnose.add_argument("logdir", metavar="LOGDIR")
    diagnose.add_argument("--run", help="only this run (as TensorBoard names it, e.g. 'train')")
    diagnose.add_argument("--tag", help="only this gradients tag (default: all)")
    diagnose.add_argument("--json", action="store_true", help="print JSON instead of a table")
    diagnose.add_argument(
        "--fail-on",
        default="",
        metavar="KINDS",
        help="comma-separated alert kinds that make the exit status 1 "
        f"({', '.join(analysis.KINDS)}, or 'any')",
    )
    diagnose.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a rule's threshold, e.g. exploding_norm=100 (repeatable; names: "
        f"{', '.join(analysis.Thresholds.names())})",
    )
    return parser


def _fail_kinds(text: str, parser) -> set:
    kinds = {k.strip() for k in text.split(",") if k.strip()}
    if "any" in kinds:
        return set(analysis.KINDS)
    unknown = kinds - set(analysis.KINDS)
    if unknown:
        parser.error(f"--fail-on: unknown kind(s) {', '.join(sorted(unknown))}")
    return kinds


def _thresholds(pairs: List[str], parser) -> analysis.Thresholds:
    overrides = {}
    for pair in pairs:
        name, separator, value = pair.partition("=")
        if not separator:
            parser.error(f"--threshold expects NAME=VALUE, got {pair!r}")
        overrides[name.strip()] = value.strip()
    try:
        return analysis.Thresholds.from_strings(overrides)
    except ValueError as error:
        parser.error(f"--threshold: {error}")


def _json_number(value):
    return value if math.isfinite(value) else str(value)


def _table(findings) -> str:
    if not findings:
        return "No gradient alerts."
    rows = [("SEVERITY", "KIND", "RUN", "TAG", "WHERE", "STEPS", "MESSAGE")]
    for run, tag, alert in findings:
        where = alert.variable or (f"layer {alert.layer}" if alert.layer else "(model)")
        span = str(alert.first_step) if alert.first_step == alert.last_step else (
            f"{alert.first_step}-{alert.last_step}"
        )
        rows.append((alert.severity, alert.kind, run, tag, where, span, alert.message))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1]
             for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def diagnose_command(args, parser) -> int:
    fail_on = _fail_kinds(args.fail_on, parser)
    thresholds = _thresholds(args.threshold, parser)
    try:
        runs = reader.read_logdir(args.logdir)
    except (FileNotFoundError, metadata.UnsupportedFormatError) as error:
        print(f"tensorboard-gradients: {error}", file=sys.stderr)
        return 2
    if args.run is not None:
        if args.run not in runs:
            print(f"tensorboard-gradients: no gradients for run {args.run!r} in {args.logdir} "
                  f"(runs: {', '.join(sorted(runs)) or 'none'})", file=sys.stderr)
            return 2
        runs = {args.run: runs[args.run]}
    findings = []
    for run in sorted(runs):
        for tag in sorted(runs[run]):
            if args.tag is not None and tag != args.tag:
                continue
            for alert in analysis.diagnose(runs[run][tag], thresholds):
                findings.append((run, tag, alert))
    severity = {s: i for i, s in enumerate(analysis.SEVERITIES)}
    findings.sort(key=lambda f: (severity[f[2].severity], f[2].first_step))
    if args.json:
        alerts = [
            dict(a.to_json(), run=run, tag=tag, value=_json_number(a.value))
            for run, tag, a in findings
        ]
        print(json.dumps({"logdir": args.logdir, "alerts": alerts}, indent=1))
    else:
        print(_table(findings))
    if not runs:
        print(f"tensorboard-gradients: no gradient summaries under {args.logdir}", file=sys.stderr)
    return 1 if any(alert.kind in fail_on for _, _, alert in findings) else 0


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "diagnose":
        try:
            return diagnose_command(args, parser)
        except BrokenPipeError:  # piped into `head`: stop quietly, as Unix tools do
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 1
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse catches it


if __name__ == "__main__":
    sys.exit(main())
