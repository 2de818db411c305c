"""Command line options: the ``ncclras`` options, the same defaults, plus ``--list``, ``--watch``, ``--check``.

The parser is a small getopt: a table of options, short options that cluster (``-vt10``), long options with
``=VALUE`` or a separate word, unique prefixes of long names. It is hand-written because ``-m``/``--monitor`` takes
an *optional, attached* argument (``-mtrace``, ``--monitor=lifecycle,trace``), as in ``ncclras``, and ``-h`` means
host, not help. Unlike ``ncclras``, a stray word is an error rather than silently ignored (``-m trace`` would
otherwise monitor the default group and drop ``trace``).
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .errors import EXIT_CODE_HELP, Exit, RasCliError

DEFAULT_HOST = "localhost"
DEFAULT_PORT = 28028
ADDR_ENV = "TORCHRAS_ADDR"
#: ``--watch`` without a number refreshes this often (as watch(1) does).
DEFAULT_WATCH_S = 2.0


class Arg(enum.Enum):
    NONE = "none"
    REQUIRED = "required"
    OPTIONAL = "optional"  # attached only: -mGROUPS, --monitor=GROUPS
    OPTIONAL_NUMBER = "optional number"  # attached, or the next word when it is a number: --watch, --watch 5


@dataclass(frozen=True)
class Spec:
    short: str | None
    long: str
    arg: Arg


SPECS: tuple[Spec, ...] = (
    Spec("h", "host", Arg.REQUIRED),
    Spec("p", "port", Arg.REQUIRED),
    Spec("t", "timeout", Arg.REQUIRED),
    Spec("v", "verbose", Arg.NONE),
    Spec("f", "format", Arg.REQUIRED),
    Spec("m", "monitor", Arg.OPTIONAL),
    Spec(None, "help", Arg.NONE),
    Spec(None, "version", Arg.NONE),
    Spec(None, "list", Arg.NONE),
    Spec(None, "journal", Arg.REQUIRED),
    Spec(None, "watch", Arg.OPTIONAL_NUMBER),
    Spec(None, "check", Arg.NONE),
    Spec(None, "no-color", Arg.NONE),
    Spec(None, "retry-for", Arg.REQUIRED),
    Spec("D", "diagnostics", Arg.NONE),
    Spec(None, "stacks", Arg.NONE),
    Spec(None, "all-threads", Arg.NONE),
    Spec(None, "native", Arg.NONE),
    Spec("r", "ranks", Arg.REQUIRED),
)

USAGE = f"""\
Usage: rascli [OPTIONS] [COMMAND...]

Ask a running torchras job what is wrong with it (an ncclras-compatible client).

Options:
  -h, --host=HOST        host of the RAS status port (default: localhost, or TORCHRAS_ADDR)
  -p, --port=PORT        port of the RAS status port (default: 28028, or TORCHRAS_ADDR)
  -t, --timeout=SECS     how long the job may take to gather the report; 0 disables the timeouts
                         (the job's default is 5 s)
  -v, --verbose          verbose report: list every rank and process that is out of line
  -f, --format=FMT       text or json (json is always passed through unchanged)
  -m, --monitor[=GROUPS] print events as they happen until the job ends or Ctrl+C; GROUPS is
                         lifecycle (default), trace or all, comma-separated, attached: -mtrace
      --watch[=SECS]     repeat the report every SECS seconds (default 2), highlighting what
                         changed; the number may also be the next word: --watch 5
  -D, --diagnostics      compare every process's configuration (versions, GPUs, NCCL_*, TORCH_*,
                         CUDA_* and TORCHRAS_* settings, clocks) and name the ranks that differ
      --stacks           where every rank is in its code: the main thread's stack of every
                         process, identical stacks folded together
      --all-threads      with --stacks: every thread, not only the main one
      --native           with --stacks: also the C and C++ frames of the processes on this host,
                         read with py-spy (pip install py-spy); never runs in the job
  -r, --ranks=LIST       with --stacks: only these ranks (0,2,5-7)
      --check            print a one-line verdict; the exit code says healthy (0) or not (1)
                         healthy = the report lists nothing under Errors and nothing under Warnings
      --list             list the torchras jobs serving on this node, with their ports
      --journal=DIR      show the verdict journals in DIR (a job's TORCHRAS_JOURNAL_DIR) as one
                         timeline; -v adds the Flight Recorder entries, -f json prints a JSON array
      --no-color         print the job's text exactly, even on a terminal (also: NO_COLOR=1)
      --retry-for=SECS   while connections go to a job process that does not answer (stopped or
                         hung), try fresh ones for SECS seconds (default 60); 0: forever, as ncclras
      --help             show this help and exit
      --version          show the version and exit

Commands (the words after the options, sent as one line; the job's one-line reply is printed):
  CONTROL PROFILER_MASK VALUE
                         NCCL 2.31's; a torchras job refuses it (its client port never changes
                         training state) with an ERROR line: exit code 5
  With no command, the job's status report is printed (see --monitor for live events).

Environment:
  TORCHRAS_ADDR          host:port or [ipv6]:port of the status port (default localhost:28028)
  TORCHRAS_RUN_DIR       where --list finds the jobs (default /tmp/torchras-<uid>/endpoints)
  TORCHRAS_TIMEOUT_FACTOR  the job's timer factor: the waits for its report scale with it (default 1)

On a terminal the report is drawn as tables, problems first. In a pipe, or with --no-color, the
job's text is printed byte for byte.

{EXIT_CODE_HELP}
"""


@dataclass(frozen=True)
class Options:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    #: True when neither -h, -p nor TORCHRAS_ADDR chose the address (it changes the connect-failure hint).
    default_addr: bool = True
    timeout: int | None = None
    verbose: bool = False
    #: As the user typed it (sent verbatim, as ncclras does); ``None`` when -f was not given.
    format: str | None = None
    #: ``None``: no monitor; ``""``: MONITOR (lifecycle); otherwise the groups, verbatim.
    monitor: str | None = None
    watch: float | None = None
    #: ``--retry-for`` in seconds (``inf`` for 0: forever); ``None``: the default (protocol.DEFAULT_RETRY_FOR).
    retry_for: float | None = None
    check: bool = False
    list: bool = False
    #: ``--journal``: the directory of the verdict journals to show; ``None``: not asked for.
    journal: str | None = None
    diagnostics: bool = False
    stacks: bool = False
    all_threads: bool = False
    #: ``--native``: after the stacks, each local process's native frames (rascli.native, py-spy).
    native: bool = False
    #: ``--ranks``: the ranks ``--stacks`` shows, as typed (``0,2,5-7``); ``None``: all.
    ranks: str | None = None
    #: The words after the options, joined by single spaces: a command sent as one line (``None``: none).
    command: str | None = None
    no_color: bool = False
    help: bool = False
    version: bool = False

    @property
    def json(self) -> bool:
        return self.format is not None and self.format.lower() == "json"


def usage_error(message: str) -> RasCliError:
    return RasCliError(f"{message}\nTry 'rascli --help' for more information.", Exit.USAGE)


def parse_addr(text: str) -> tuple[str, int]:
    """``host:port``, ``[ipv6]:port``, or a bare host (the default port)."""
    match = re.fullmatch(r"\[([^\]]+)\](?::(\d+))?", text)
    if match:
        host, port = match.group(1), match.group(2)
    elif text.count(":") == 1:
        host, port = text.split(":")
    elif ":" not in text:
        host, port = text, None
    else:
        raise ValueError(f"'{text}' is not host:port or [ipv6]:port")
    if not host:
        raise ValueError(f"'{text}' has no host")
    return host, DEFAULT_PORT if port is None else _port(port)


def _port(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"invalid port '{text}' (1-65535)")
    return int(text)


def _lookup_long(name: str) -> Spec:
    exact = [s for s in SPECS if s.long == name]
    matches = exact or [s for s in SPECS if s.long.startswith(name)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise usage_error(f"unrecognized option '--{name}'")
    raise usage_error(f"option '--{name}' is ambiguous ({', '.join('--' + s.long for s in matches)})")


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _tokens(argv: Sequence[str], words: list[str]) -> list[tuple[Spec, str | None]]:
    """Split argv into (option, value) pairs, getopt-style; the other words go to ``words`` (a command, as
    ncclras 2.31 takes positional commands), in order."""
    pairs: list[tuple[Spec, str | None]] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        i += 1
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word[2:].partition("=")
            spec = _lookup_long(name)
            if spec.arg is Arg.NONE and eq:
                raise usage_error(f"option '--{spec.long}' doesn't allow an argument")
            if spec.arg is Arg.REQUIRED and not eq:
                if i == len(argv):
                    raise usage_error(f"option '--{spec.long}' requires an argument")
                value, i = argv[i], i + 1
            elif spec.arg is Arg.OPTIONAL_NUMBER and not eq and i < len(argv) and _is_number(argv[i]):
                value, eq, i = argv[i], "=", i + 1
            pairs.append((spec, value if (eq or spec.arg is Arg.REQUIRED) else None))
        elif word.startswith("-") and len(word) > 1 and word != "--":
            j = 1
            while j < len(word):
                letter = word[j]
                found = next((s for s in SPECS if s.short == letter), None)
                if found is None:
                    raise usage_error(f"invalid option -- '{letter}'")
                spec = found
                j += 1
                if spec.arg is Arg.NONE:
                    pairs.append((spec, None))
                    continue
                rest = word[j:]
                if spec.arg is Arg.REQUIRED and not rest:
                    if i == len(argv):
                        raise usage_error(f"option requires an argument -- '{letter}'")
                    rest, i = argv[i], i + 1
                pairs.append((spec, rest if rest or spec.arg is Arg.REQUIRED else None))
                break
        else:
            if pairs and pairs[-1][0].long == "monitor" and pairs[-1][1] is None and not words:
                # ncclras sends the word as a command; here it is almost always a group meant for -m.
                raise usage_error(
                    f"unexpected argument '{word}' (monitor groups must be attached: -m{word} or --monitor={word})"
                )
            words.append(word)
    return pairs


def parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Options:
    """Parse the command line (without the program name); raises ``RasCliError`` with ``Exit.USAGE``."""
    environ = os.environ if environ is None else environ
    host = port = None
    timeout: int | None = None
    output_format: str | None = None
    monitor: str | None = None
    watch: float | None = None
    retry_for: float | None = None
    journal: str | None = None
    ranks: str | None = None
    words: list[str] = []
    switches: set[str] = set()  # the options without an argument that were given (Options' field names)
    for spec, value in _tokens(argv, words):
        key = spec.long.replace("-", "_")
        if spec.long == "host":
            host = value
        elif spec.long == "port":
            try:
                port = _port(value or "")
            except ValueError as err:
                raise usage_error(str(err)) from None
        elif spec.long == "timeout":
            if value is None or not re.fullmatch(r"\d+", value):
                raise usage_error(f"invalid timeout '{value}' (whole seconds, 0 disables the timeouts)")
            timeout = int(value)
        elif spec.long == "format":
            if (value or "").lower() not in ("text", "json"):
                raise usage_error(f"invalid format '{value}' (must be text or json)")
            output_format = value
        elif spec.long == "monitor":
            monitor = value or ""
        elif spec.long == "watch":
            try:
                seconds = DEFAULT_WATCH_S if value is None else float(value)
            except ValueError:
                seconds = -1.0
            if not seconds > 0 or seconds != seconds or seconds == float("inf"):
                raise usage_error(f"invalid --watch interval '{value}' (seconds, more than 0)")
            watch = seconds
        elif spec.long == "journal":
            if not value:
                raise usage_error("option '--journal' requires a directory")
            journal = value
        elif spec.long == "ranks":
            if not value or not re.fullmatch(r"\d+(-\d+)?(,\d+(-\d+)?)*", value):
                raise usage_error(f"invalid --ranks '{value}' (ranks and ranges: 0,2,5-7)")
            ranks = value
        elif spec.long == "retry-for":
            try:
                seconds = float(value or "")
            except ValueError:
                seconds = -1.0
            if not 0 <= seconds < float("inf"):  # also refuses nan
                raise usage_error(f"invalid --retry-for '{value}' (seconds, 0 retries forever)")
            retry_for = seconds or float("inf")
        else:
            switches.add(key)

    default_addr = host is None and port is None
    env_addr = environ.get(ADDR_ENV, "").strip()
    env_host, env_port = DEFAULT_HOST, DEFAULT_PORT
    if env_addr:
        default_addr = False
        try:
            env_host, env_port = parse_addr(env_addr)
        except ValueError as err:
            if host is None or port is None:
                raise usage_error(f"{ADDR_ENV}: {err}") from None
    options = Options(
        host=host if host is not None else env_host,
        port=port if port is not None else env_port,
        default_addr=default_addr,
        timeout=timeout,
        verbose="verbose" in switches,
        format=output_format,
        monitor=monitor,
        watch=watch,
        retry_for=retry_for,
        check="check" in switches,
        list="list" in switches,
        journal=journal,
        diagnostics="diagnostics" in switches,
        stacks="stacks" in switches,
        all_threads="all_threads" in switches,
        native="native" in switches,
        ranks=ranks,
        command=" ".join(words) if words else None,
        no_color="no_color" in switches,
        help="help" in switches,
        version="version" in switches,
    )
    _check_combinations(options)
    return options


def _check_combinations(options: Options) -> None:
    modes = [
        name
        for name, on in (
            ("--monitor", options.monitor is not None),
            ("--watch", options.watch is not None),
            ("--check", options.check),
            ("--list", options.list),
            ("--journal", options.journal is not None),
            ("--diagnostics", options.diagnostics),
            ("--stacks", options.stacks),
            (f"the command '{options.command}'", options.command is not None),
        )
        if on
    ]
    if len(modes) > 1:
        raise usage_error(f"{' and '.join(modes)} cannot be used together")
    if (options.all_threads or options.native or options.ranks is not None) and not options.stacks:
        raise usage_error("--all-threads, --native and --ranks go with --stacks")
    if options.json and (options.watch is not None or options.check):
        raise usage_error(f"{modes[0]} reads the text report; it cannot be used with --format=json")
