"""The trainer's console output: one format, third-party warnings once each, replicas quiet.

A training process of a 2-process CPU job used to print ~340 lines for 30 steps: torch's c10d deprecation warning
on every collective of every step, from every rank, each as two lines (the warning and its source line), and
transformers' own warnings the same way. The useful lines were lost among them. So by default (`FTJOB_LOG_LEVEL`
unset or `info`):

- every log record goes through one handler on the root logger, in one format that names the rank and the full
  logger name; transformers' and datasets' own stderr handlers, and DeepSpeed's stdout one (`adopt_loggers`), are
  replaced by propagation to it;
- a Python warning (`warnings.warn`) becomes one log line on the `py.warnings` logger, naming its category and
  where it was raised;
- a warning from a third-party logger or the warnings module is shown the first time its text appears; later
  occurrences are counted (`RepeatFilter`) and `finish` prints one line saying how many were left out;
- ranks other than 0 print errors only: the other ranks repeat rank 0's lines, warnings included;
- no library prints progress bars; our own (`finetune_trainer.progress.ProgressBar`) only on rank 0 in a terminal.

`FTJOB_LOG_LEVEL=debug` (what `ftjob run --verbose` sets) brings everything back: every warning every time, every
rank, and debug lines; `warning` and `error` make the main process quieter still. `FTJOB_LOG_LEVEL` accepts the
names in `LEVELS`. `FTJOB_LOG_FORMAT=json` writes one JSON object per line instead (for log collectors): `time`,
`level`, `logger`, `rank`, `message`, and the fields a record carries under `FIELDS` (the progress line's numbers).

The setup is process-wide and done once by `finetune_trainer.__main__` before anything else is imported.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

from finetune_api.constants import ENV_LOG_FORMAT, ENV_LOG_LEVEL

LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
"""The values `FTJOB_LOG_LEVEL` takes; `debug` also turns off the de-duplication and the replicas' silence."""
DEFAULT_LEVEL = "info"
FORMATS = ("text", "json")
"""The values `FTJOB_LOG_FORMAT` takes (default `text`)."""
OWN_LOGGERS = ("finetune_trainer", "finetune_api")
"""Top-level logger names whose records are ours: never de-duplicated (each line says something new)."""
LIBRARY_LOGGING = ("transformers", "datasets")
"""Libraries that log through a stderr handler of their own (`<lib>.utils.logging`) and do not propagate."""
LIBRARY_PROPAGATION = ("disable_default_handler", "enable_propagation")
"""What makes such a library's records propagate to the root logger instead (where our handler is)."""
LIBRARY_BARS = (
    ("datasets.utils", "disable_progress_bars"),
    ("huggingface_hub.utils", "disable_progress_bars"),
    ("transformers.utils.logging", "disable_progress_bar"),
)
"""The switches that turn off the libraries' own tqdm bars (tokenizing, packing, downloads): off unless a bar may be
shown (`show_bar`: rank 0, in a terminal), since in a log file each bar is a screenful of lines."""
ADOPTED_LOGGERS = ("DeepSpeed",)
"""Loggers a library sets up at import with a stream handler of its own and no propagation (DeepSpeed: stdout, at
WARNING, on every rank); `adopt_loggers` makes them ours once the library is imported."""
FIELDS = "ftjob_fields"
"""The `extra=` key under which a record carries structured fields for the JSON format (a dict)."""
WARNINGS_LOGGER = "py.warnings"
TEXT_FORMAT = "%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s"


@dataclass(frozen=True)
class OutputSettings:
    """What this process prints: its rank, the level it was asked for, and the format."""

    rank: int = 0
    level: str = DEFAULT_LEVEL
    json: bool = False

    @property
    def verbose(self) -> bool:
        """Everything, as the libraries would print it: no de-duplication, every rank."""
        return LEVELS[self.level] <= logging.DEBUG

    @property
    def root_level(self) -> int:
        """The root logger's level: the asked level on rank 0 (and everywhere when verbose), else errors only."""
        return LEVELS[self.level] if self.rank == 0 or self.verbose else logging.ERROR


def settings_from_env(environ: Mapping[str, str]) -> tuple[OutputSettings, list[str]]:
    """The settings from `RANK`, `FTJOB_LOG_LEVEL` and `FTJOB_LOG_FORMAT`, and a note for each value not
    understood (that knob keeps its default; a typo in a logging knob must not stop a training). Pure."""
    notes: list[str] = []
    level = environ.get(ENV_LOG_LEVEL, "").strip().lower() or DEFAULT_LEVEL
    if level not in LEVELS:
        notes.append(f"{ENV_LOG_LEVEL}={level!r} is not one of {', '.join(LEVELS)}; using {DEFAULT_LEVEL}")
        level = DEFAULT_LEVEL
    fmt = environ.get(ENV_LOG_FORMAT, "").strip().lower() or "text"
    if fmt not in FORMATS:
        notes.append(f"{ENV_LOG_FORMAT}={fmt!r} is not one of {', '.join(FORMATS)}; using text")
        fmt = "text"
    try:
        rank = int(environ.get("RANK", "0"))
    except ValueError:
        rank = 0
    return OutputSettings(rank=rank, level=level, json=fmt == "json"), notes


class RepeatFilter(logging.Filter):
    """Lets the first record of each third-party warning text through and counts the later ones.

    The key is the level and the formatted message, not the place it came from: the same deprecation raised
    from two call sites is one warning to the reader. Errors, other levels and our own loggers' records always
    pass (a library's info lines, say each upload of a push, are distinct events)."""

    def __init__(self, own: tuple[str, ...] = OWN_LOGGERS) -> None:
        super().__init__()
        self.own = own
        self.repeats: dict[str, int] = {}
        """Each distinct text seen (level-prefixed) → how many later occurrences were left out."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or record.name.split(".", 1)[0] in self.own:
            return True
        key = f"{record.levelname}:{record.getMessage()}"
        if key in self.repeats:
            self.repeats[key] += 1
            return False
        self.repeats[key] = 0
        return True

    def summary(self) -> str | None:
        """One line on what was left out, or None when nothing was."""
        repeated = [n for n in self.repeats.values() if n]
        if not repeated:
            return None
        return (
            f"{len(repeated)} warning{'s' if len(repeated) != 1 else ''} repeated {sum(repeated)} more "
            f"time{'s' if sum(repeated) != 1 else ''} (not shown); --verbose ({ENV_LOG_LEVEL}=debug) shows them"
        )


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, rank, message, FIELDS, exception."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "rank": self.rank,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            doc.update({k: v for k, v in fields.items() if k not in doc})
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class ConsoleHandler(logging.StreamHandler[TextIO]):
    """stderr, written around a live tqdm bar (rank 0 in a terminal) instead of through it."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm_module = sys.modules.get("tqdm")
        bars = getattr(getattr(tqdm_module, "tqdm", None), "_instances", None)
        if not bars:
            super().emit(record)
            return
        try:
            tqdm_module.tqdm.write(self.format(record), file=self.stream)  # type: ignore[union-attr]
        except Exception:
            self.handleError(record)


def warning_text(message: Warning | str, category: type[Warning], filename: str, lineno: int) -> str:
    """A warning as one line: category, message, and the file below site-packages (or its name) with the line."""
    marker = "site-packages" + os.sep
    where = filename.split(marker, 1)[1] if marker in filename else os.path.basename(filename)
    return f"{category.__name__}: {message} ({where}:{lineno})"


class Output:
    """The installed setup: its settings, handler and repeat filter; `finish` prints the summary."""

    def __init__(self, settings: OutputSettings, stream: TextIO | None = None) -> None:
        self.settings = settings
        self.repeats = RepeatFilter()
        self.handler = ConsoleHandler(stream if stream is not None else sys.stderr)
        if settings.json:
            self.handler.setFormatter(JsonFormatter(settings.rank))
        else:
            self.handler.setFormatter(logging.Formatter(TEXT_FORMAT.format(rank=settings.rank)))
        if not settings.verbose:
            self.handler.addFilter(self.repeats)
        self._previous_showwarning = warnings.showwarning

    def install(self) -> None:
        """Make this the process's only console output for logging and (unless verbose) warnings."""
        root = logging.getLogger()
        for old in list(root.handlers):  # a console handler set up before (basicConfig) would print lines twice
            if isinstance(old, logging.StreamHandler) and old.stream in (sys.stderr, sys.stdout):
                root.removeHandler(old)
        root.addHandler(self.handler)
        root.setLevel(self.settings.root_level)
        for name in OWN_LOGGERS:  # our modules may have set a level of their own before
            logging.getLogger(name).setLevel(logging.NOTSET)
        _call_each(tuple((f"{name}.utils.logging", f) for name in LIBRARY_LOGGING for f in LIBRARY_PROPAGATION))
        if not self.settings.verbose:
            warnings.showwarning = self._show_warning
            if not show_bar(self.settings, self.handler.stream):
                _call_each(LIBRARY_BARS)

    def uninstall(self) -> None:
        """Undo `install` (tests)."""
        logging.getLogger().removeHandler(self.handler)
        warnings.showwarning = self._previous_showwarning

    def _show_warning(
        self,
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        logging.getLogger(WARNINGS_LOGGER).warning("%s", warning_text(message, category, filename, lineno))

    def finish(self) -> None:
        """On rank 0, one line on the warnings left out (if any)."""
        text = self.repeats.summary()
        if text and self.settings.rank == 0:
            logging.getLogger("finetune_trainer").log(max(logging.INFO, LEVELS[self.settings.level]), "%s", text)


def adopt_loggers(names: tuple[str, ...] = ADOPTED_LOGGERS) -> None:
    """Give the named loggers that exist by now (their library was imported) to the root handler: their own
    handlers removed, propagation on, level left to the root (so replicas' warnings are dropped like any other)."""
    for name in names:
        if name not in logging.Logger.manager.loggerDict:
            continue
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
        logger.setLevel(logging.NOTSET)


def _call_each(functions: tuple[tuple[str, str], ...]) -> None:
    """Call each `module.function()`; a library that is not installed (or lacks the function) is skipped."""
    import importlib

    for module_name, function in functions:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        getattr(module, function, lambda: None)()


_installed: Output | None = None


def setup(environ: Mapping[str, str] | None = None) -> Output:
    """Install the output for this process from the environment (once; a second call returns the first)."""
    global _installed
    if _installed is None:
        settings, notes = settings_from_env(os.environ if environ is None else environ)
        _installed = Output(settings)
        _installed.install()
        for note in notes:
            logging.getLogger("finetune_trainer").warning("%s", note)
    return _installed


def finish() -> None:
    """The summary line of the installed output, if any."""
    if _installed is not None:
        _installed.finish()


def show_bar(settings: OutputSettings, stream: TextIO | None = None) -> bool:
    """A progress bar only on rank 0, in text format, when stderr is a terminal; otherwise the log lines are the
    progress (a bar's carriage returns make a log file or `kubectl logs` unreadable)."""
    stream = stream if stream is not None else sys.stderr
    return settings.rank == 0 and not settings.json and stream.isatty()


def installed_settings() -> OutputSettings:
    """The settings in force (the defaults when `setup` was not called, e.g. in tests)."""
    return _installed.settings if _installed is not None else settings_from_env(os.environ)[0]

