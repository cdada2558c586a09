"""``tensorboard-gradients diagnose LOGDIR``: the alerts of a logdir, without a browser.

    tensorboard-gradients diagnose runs/ [--run R] [--tag T] [--json] [--every-alert]
        [--fail-on critical|warning|KINDS|any|none] [--threshold exploding_norm=100 ...]

Prints one row per finding: the alerts of one rule over one stretch of steps ("16 of 18
tensors exploded ... at steps 31-32, first dense_00/kernel", `analysis.groups`), the table as
wide as the terminal (the message column wraps; piped into a file or a pager, a row per line); with
``--every-alert`` one line per alert; with ``--json`` a JSON document (``alerts``, ``groups``
whose ``alerts`` index that list, and ``problems``). A tag whose writer logged only some of the
gradient stats (``stats=``) gets a line after the table saying which were not logged and which
rules could not judge it for want of them (JSON: ``not_logged``, only when there is one). A
training pipeline can gate on the exit status. Rules and defaults:
`tensorboard_gradients.analysis`. Runs of any length: the logged steps are located first, then
decoded and judged `STEPS_PER_READ` at a time (`analysis.AnalysisStream`), so memory is bounded
by that, not by the run.

One broken run never hides the others: what cannot be read is skipped and reported on stderr, one
line per problem of the selected runs and tags (run, tag, file, what is wrong; see
`reader.read_logdir_report`). A "damaged" problem (some records or points were skipped, the rest
was read) is a warning; an "unreadable" one (nothing of a file or tag could be read) means the
answer may be incomplete, and the exit status says so. Names read from the logdir are printed
with control characters escaped (ESC as \\x1b), so a crafted name cannot drive the terminal.

Exit status (a CI gate: tensorboard-gradients diagnose runs/ || exit 1):
  0  nothing of a --fail-on kind or severity was found, and everything selected was read
     (damaged records aside)
  1  an alert of a --fail-on kind or severity was found (default: critical, i.e. nonfinite and
     exploding gradients fail the gate without any flag)
  2  bad arguments, no such LOGDIR, or --run / --tag names a run or tag that is not there or
     could not be read at all
  3  nothing of a --fail-on kind was found, but a selected run, file or tag could not be read,
     so there may be one in what was not read; or LOGDIR itself could not be listed (a bucket
     that does not answer or refuses the credentials)
  4  nothing was judged: the selection holds no gradient data (a wrong path, or a job whose
     monitor was never attached); the message names what was found there instead
Piped into a command that stops reading (| head), it stops quietly with status 0.
"""

import argparse
import json
import math
import os
import shutil
import sys
import textwrap
from typing import List, Optional

from tensorboard_gradients import analysis
from tensorboard_gradients.analysis import groups
from tensorboard_gradients.format import inventory, metadata, reader

EXIT_OK = 0
EXIT_ALERT = 1
EXIT_USAGE = 2  # also argparse's status for bad arguments
EXIT_UNREADABLE = 3
EXIT_NOTHING_JUDGED = 4

# --fail-on's words beside the kinds: a severity fails on its alerts and every more severe one.
FAIL_ON_ANY, FAIL_ON_NONE = "any", "none"
DEFAULT_FAIL_ON = "critical"


def _parser():
    parser = argparse.ArgumentParser(
        prog="tensorboard-gradients",
        description="Diagnose vanishing, exploding and non-finite gradients in a logdir.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    diagnose = commands.add_parser(
        "diagnose",
        help="print the gradient alerts of every run in LOGDIR",
        description="Print the gradient alerts of every run in LOGDIR (most severe first). "
        "Runs, files and tags that cannot be read are reported on stderr and skipped.",
        epilog=__doc__[__doc__.index("Exit status"):],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    diagnose.add_argument(
        "logdir", metavar="LOGDIR",
        help="a directory, or a bucket URL (s3://bucket/logs, gs://bucket/logs, any fsspec URL; "
        "credentials from the store's standard environment)")
    diagnose.add_argument("--run", help="only this run (as TensorBoard names it, e.g. 'train')")
    diagnose.add_argument("--tag", help="only this gradients tag (default: all)")
    diagnose.add_argument("--json", action="store_true", help="print JSON instead of a table")
    diagnose.add_argument(
        "--every-alert", action="store_true",
        help="one line per alert (default: one per finding, the alerts of one rule over one "
        "stretch of steps, e.g. '16 of 18 tensors exploded at steps 31-32')")
    diagnose.add_argument(
        "--fail-on",
        default=DEFAULT_FAIL_ON,
        metavar="WHAT",
        help="comma-separated alert kinds and severities that make the exit status 1: a "
        "severity counts its alerts and every more severe one "
        f"(kinds: {', '.join(analysis.KINDS)}; severities: {', '.join(analysis.SEVERITIES)}); "
        f"'{FAIL_ON_ANY}' for every alert, '{FAIL_ON_NONE}' to only report "
        f"(default: {DEFAULT_FAIL_ON})",
    )
    diagnose.add_argument(
        "--loss-scalar", action="append", metavar="TAG",
        help="the run's loss scalar, when a monitor did not log the loss beside the gradients "
        f"(repeatable; looked for first, then {', '.join(metadata.LOSS_SCALARS)})")
    diagnose.add_argument(
        "--threshold",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a rule's threshold, e.g. exploding_norm=100 (repeatable; names: "
        f"{', '.join(analysis.Thresholds.names())})",
    )
    return parser


def _fails(text: str, parser):
    """The test --fail-on ``text`` puts to an alert: ``fails(alert) -> bool``."""
    words = {w.strip() for w in text.split(",") if w.strip()}
    valid = set(analysis.KINDS) | set(analysis.SEVERITIES) | {FAIL_ON_ANY, FAIL_ON_NONE}
    unknown = words - valid
    if unknown or not words:
        named = ", ".join(sorted(unknown)) or repr(text)
        parser.error(f"--fail-on: unknown kind or severity {named} (valid: {', '.join(analysis.KINDS)}; {', '.join(analysis.SEVERITIES)}; "
                     f"{FAIL_ON_ANY}; {FAIL_ON_NONE})")
    if FAIL_ON_NONE in words and len(words) > 1:
        parser.error(f"--fail-on: '{FAIL_ON_NONE}' cannot be combined with "
                     f"{', '.join(sorted(words - {FAIL_ON_NONE}))}")
    rank = {severity: i for i, severity in enumerate(analysis.SEVERITIES)}
    least_severe = max((rank[w] for w in words if w in rank), default=-1)
    return lambda alert: (FAIL_ON_ANY in words or alert.kind in words
                          or rank[alert.severity] <= least_severe)


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


def _printable(text: str) -> str:
    """``text`` with every unprintable character (terminal escapes, line breaks, bidi overrides,
    lone surrogates of undecodable file names) written as its Python escape, e.g. ``\\x1b``."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
                   for c in text)


def _complain(message: str):
    print(f"tensorboard-gradients: {_printable(message)}", file=sys.stderr)


def _json_number(value):
    return value if math.isfinite(value) else str(value)


def _span(first_step: int, last_step: int) -> str:
    return str(first_step) if first_step == last_step else f"{first_step}-{last_step}"


# A column the table narrows (wrapping its cells) keeps at least this many characters.
_NARROWEST_COLUMN = 8
_GAP = "  "


def _terminal_width() -> Optional[int]:
    """The width to fit: the terminal's ($COLUMNS first, as `shutil.get_terminal_size` reads
    it); None (no wrapping) when the output is a file or a pipe, whatever $COLUMNS says (CI
    runners and pytest-xdist set it): there a row per line is what grep and scripts expect."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def _fitted_widths(natural: List[int], width: Optional[int]) -> List[int]:
    """Column widths whose sum, gaps included, fits ``width``: the widest column is narrowed one
    character at a time (the message first, being the widest), none below `_NARROWEST_COLUMN`."""
    widths = list(natural)
    if width is None:
        return widths
    room = width - len(_GAP) * (len(widths) - 1)
    while sum(widths) > room:
        widest = max(range(len(widths)), key=lambda i: widths[i])
        if widths[widest] <= _NARROWEST_COLUMN:
            break  # a terminal too narrow for any table: let the lines run over
        widths[widest] -= 1
    return widths


def _table(lines, width: Optional[int] = None) -> str:
    """``lines``: (severity, kind, run, tag, where, first step, last step, message), as a table
    that fits ``width`` characters (None: each row on one line), cells wrapped on their spaces
    (long names broken where they must)."""
    if not lines:
        return "No gradient alerts."
    rows = [("SEVERITY", "KIND", "RUN", "TAG", "WHERE", "STEPS", "MESSAGE")]
    for severity, kind, run, tag, where, first_step, last_step, message in lines:
        rows.append(tuple(_printable(cell) for cell in (
            severity, kind, run, tag, where, _span(first_step, last_step), message
        )))
    widths = _fitted_widths([max(len(row[i]) for row in rows) for i in range(len(rows[0]))],
                            width)
    text = []
    for row in rows:
        cells = [textwrap.wrap(cell, w, break_on_hyphens=False) or [""]
                 for cell, w in zip(row, widths)]
        for line in range(max(len(c) for c in cells)):
            parts = [(c[line] if line < len(c) else "").ljust(w) for c, w in zip(cells, widths)]
            text.append(_GAP.join(parts).rstrip())
    return "\n".join(text)


def _is_selected(problem: reader.Problem, args) -> bool:
    """Whether a problem concerns what the command reads: a whole file of a selected run counts
    for every tag (it may hold any of them), a tag's histograms for the tag."""
    if args.run is not None and problem.run != args.run:
        return False
    return args.tag is None or problem.tag in (None, args.tag, metadata.histogram_tag(args.tag))


def _absent(what: str, name: str, available, problems, logdir) -> int:
    """Reports a --run / --tag that names nothing readable."""
    if any(p.kind == reader.UNREADABLE for p in problems):
        _complain(f"{what} {name!r} could not be read (see above)")
    else:
        _complain(f"no gradients for {what} {name!r} in {logdir} "
                  f"({what}s: {', '.join(sorted(available)) or 'none'})")
    return EXIT_USAGE


# Logged steps decoded at a time: memory stays bounded by this (1,000 variables: ~90 MB).
STEPS_PER_READ = 2000


def diagnose_logged(logged: reader.LoggedSeries, thresholds) -> List[analysis.Alert]:
    """The alerts of a logged series, read and judged `STEPS_PER_READ` steps at a time (an
    `analysis.AnalysisStream`: the same alerts as `analysis.diagnose` of the whole series)."""
    stream = analysis.AnalysisStream(logged.rows(0, 0), thresholds)
    for start in range(0, len(logged), STEPS_PER_READ):
        rows = logged.rows(start, start + STEPS_PER_READ)
        stream.feed_rows(rows)
    stream.close()
    return stream.alerts()


def _grouped(judged, findings):
    """(run, tag, `groups.AlertGroup`, its alerts' positions in ``findings``) of each judged
    series."""
    position = {id(alert): index for index, (_, _, alert) in enumerate(findings)}
    result = []
    for run, tag, logged, alerts in judged:
        names = logged.rows(0, 0)
        for found in groups.group(alerts, names.variables, names.layers):
            result.append((run, tag, found, [position[id(alerts[i])] for i in found.alerts]))
    return result


def _not_logged(judged):
    """(run, tag, the gradient stats not logged, ``{rule: the stats it lacks}`` of the rules
    that could not judge it for want of them) of each judged series whose writer left gradient
    stats out: "no alert" of a rule that judged nothing must not read as a clean bill."""
    notes = []
    for run, tag, logged, _ in judged:
        like = logged.rows(0, 0)
        unlogged = set(like.unlogged_stats)
        if unlogged:
            unjudged = {rule: lacked for rule, lacked in analysis.lacking(like).items()
                        if unlogged.intersection(lacked)}
            notes.append((run, tag, like.unlogged_stats, unjudged))
    return notes


def _not_logged_line(run, tag, unlogged, unjudged) -> str:
    rules = "; ".join(f"{rule} (needs {', '.join(lacked)})" for rule, lacked in unjudged.items())
    return _printable(f"Not logged in run {run!r}, tag {tag!r}: {', '.join(unlogged)} (the "
                      "writer's stats= left them out)"
                      + (f"; not judged: {rules}" if rules else "") + ".")


def _selected_problems(scan, args):
    """The problems of the selected runs and tags, each reported once on stderr."""
    problems = [p for p in scan.problems if _is_selected(p, args)]
    for problem in problems:
        _complain(f"{problem.kind}: {problem}")
    return problems


def _nothing_judged(args, scan, problems) -> int:
    """The selection holds no gradient data: what was found instead, and the exit status (3
    when something selected could not be read: the gradients may be in it)."""
    if any(p.kind == reader.UNREADABLE for p in problems):
        _complain("no gradient data could be read (see above)")
        return EXIT_UNREADABLE
    if args.run not in scan.inventory.runs:
        message = scan.inventory.describe()
    else:
        message = (f"No gradient data in run {args.run!r} of {args.logdir} (runs with "
                   f"gradients: {', '.join(sorted(scan.runs)) or 'none'}).")
    if args.json:
        print(json.dumps({"logdir": args.logdir, "alerts": [], "groups": [],
                          "problems": [p.to_json() for p in problems],
                          "no_gradient_data": message}, indent=1))
    _complain(message)
    print(inventory.hint(), file=sys.stderr)
    return EXIT_NOTHING_JUDGED


def diagnose_command(args, parser) -> int:
    fails = _fails(args.fail_on, parser)
    thresholds = _thresholds(args.threshold, parser)
    try:
        scan = reader.scan_logdir_report(args.logdir, tuple(args.loss_scalar or ())
                                         + metadata.LOSS_SCALARS)
    except FileNotFoundError as error:
        _complain(str(error))
        return EXIT_USAGE
    except OSError as error:  # a bucket that cannot be listed: unreachable, permission denied
        _complain(str(error))
        return EXIT_UNREADABLE
    runs = scan.runs
    if args.run is not None and args.run not in runs:
        problems = _selected_problems(scan, args)
        if args.run in scan.inventory.runs and not any(
                p.kind == reader.UNREADABLE for p in problems):
            return _nothing_judged(args, scan, problems)
        return _absent("run", args.run, runs, problems, args.logdir)
    if not runs:
        return _nothing_judged(args, scan, _selected_problems(scan, args))
    if args.run is not None:
        runs = {args.run: runs[args.run]}
    selected = [(run, tag, runs[run][tag]) for run in sorted(runs) for tag in sorted(runs[run])
                if args.tag is None or tag == args.tag]
    if args.tag is not None and not selected:
        tags = {tag for run_tags in runs.values() for tag in run_tags}
        return _absent("tag", args.tag, tags, _selected_problems(scan, args), args.logdir)
    judged = [(run, tag, logged, diagnose_logged(logged, thresholds))
              for run, tag, logged in selected]
    findings = [(run, tag, alert) for run, tag, _, alerts in judged for alert in alerts]
    problems = _selected_problems(scan, args)
    severity = {s: i for i, s in enumerate(analysis.SEVERITIES)}
    findings.sort(key=lambda f: (severity[f[2].severity], f[2].first_step))
    grouped = _grouped(judged, findings)
    grouped.sort(key=lambda g: (severity[g[2].severity], g[2].first_step))
    not_logged = _not_logged(judged)
    if args.json:
        alerts = [
            dict(a.to_json(), run=run, tag=tag, value=_json_number(a.value))
            for run, tag, a in findings
        ]
        group_list = [dict(g.to_json(), run=run, tag=tag, alerts=members)
                      for run, tag, g, members in grouped]
        problem_list = [p.to_json() for p in problems]
        document = {"logdir": args.logdir, "alerts": alerts, "groups": group_list,
                    "problems": problem_list}
        if not_logged:  # like a tag's "not_logged" in the plugin: only when there is one
            document["not_logged"] = [
                {"run": run, "tag": tag, "stats": list(unlogged),
                 "not_judged": {rule: list(lacked) for rule, lacked in unjudged.items()}}
                for run, tag, unlogged, unjudged in not_logged]
        print(json.dumps(document, indent=1))
    else:
        if args.every_alert:
            print(_table([(a.severity, a.kind, run, tag,
                           a.variable or (f"layer {a.layer}" if a.layer else "(model)"),
                           a.first_step, a.last_step, a.message) for run, tag, a in findings],
                         _terminal_width()))
        else:
            print(_table([(g.severity, g.kind, run, tag,
                           groups.subject_name(g.unit, g.first)
                           + (f" and {g.subjects - 1} more" if g.subjects > 1 else ""),
                           g.first_step, g.last_step, g.message) for run, tag, g, _ in grouped],
                         _terminal_width()))
        for note in not_logged:
            print(_not_logged_line(*note))
    if any(fails(alert) for _, _, alert in findings):
        return EXIT_ALERT
    if any(p.kind == reader.UNREADABLE for p in problems):
        return EXIT_UNREADABLE
    return EXIT_OK


def main(argv: Optional[List[str]] = None) -> int:
    # Printable names outside the terminal's encoding are escaped rather than fatal.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "diagnose":
        try:
            status = diagnose_command(args, parser)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
            return status
        except BrokenPipeError:
            # Piped into `head`, which read what it wanted: stop quietly, as Unix tools do (a
            # cut-off table is not an alert), with stdout on devnull so the exit's flush is quiet.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return EXIT_OK
    parser.error(f"unknown command {args.command!r}")  # pragma: no cover - argparse catches it


if __name__ == "__main__":
    sys.exit(main())
