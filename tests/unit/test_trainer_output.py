"""finetune_trainer.output: the knobs, the repeat filter, warnings as one log line each, replicas quiet, JSON lines.

Each test installs an `Output` on a StringIO and removes it afterwards, so the process's logging is left as found.
"""

import io
import json
import logging
import sys
import warnings
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from finetune_api.constants import ENV_LOG_FORMAT, ENV_LOG_LEVEL
from finetune_trainer import output
from finetune_trainer.output import Output, OutputSettings, RepeatFilter, settings_from_env, show_bar, warning_text


def record(name: str, level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """Root handlers and level, library loggers' state and the warnings machinery as they were."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    show = warnings.showwarning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        yield
    root.handlers[:] = handlers
    root.setLevel(level)
    warnings.showwarning = show
    if "transformers" in sys.modules:  # install() made its logger propagate instead of printing itself
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_propagation()
        transformers_logging.enable_default_handler()


def installed(settings: OutputSettings) -> tuple[Output, io.StringIO]:
    stream = io.StringIO()
    out = Output(settings, stream)
    out.install()
    return out, stream


def test_the_first_occurrence_of_a_text_passes_and_repeats_are_counted() -> None:
    f = RepeatFilter()
    texts = ["deprecated A", "deprecated B", "deprecated A", "deprecated A", "deprecated B"]
    passed = [f.filter(record("torch.distributed", logging.WARNING, t)) for t in texts]
    assert passed == [True, True, False, False, False]
    assert f.summary() == (
        f"2 warnings repeated 3 more times (not shown); --verbose ({ENV_LOG_LEVEL}=debug) shows them"
    )


def test_the_same_text_from_another_logger_is_the_same_warning() -> None:
    f = RepeatFilter()
    assert f.filter(record("transformers.modeling_utils", logging.WARNING, "x is deprecated"))
    assert not f.filter(record("py.warnings", logging.WARNING, "x is deprecated"))
    assert f.summary() is not None and f.summary().startswith("1 warning repeated 1 more time ")  # type: ignore[union-attr]


def test_errors_info_lines_and_our_own_lines_are_never_filtered() -> None:
    f = RepeatFilter()
    for _ in range(3):
        assert f.filter(record("torch.distributed", logging.ERROR, "collective failed"))
        assert f.filter(record("httpx", logging.INFO, "HTTP Request: PUT ... 200 OK"))
        assert f.filter(record("finetune_trainer.checkpoints", logging.WARNING, "same words"))
        assert f.filter(record("finetune_trainer", logging.INFO, "same words"))
    assert f.summary() is None


@pytest.mark.parametrize(
    ("environ", "expected", "notes"),
    [
        ({}, OutputSettings(rank=0, level="info", json=False), 0),
        ({"RANK": "3", ENV_LOG_LEVEL: "DEBUG", ENV_LOG_FORMAT: "json"}, OutputSettings(3, "debug", True), 0),
        ({ENV_LOG_LEVEL: "loud", ENV_LOG_FORMAT: "xml"}, OutputSettings(0, "info", False), 2),
    ],
    ids=["defaults", "every knob set", "values not understood keep the defaults, with a note each"],
)
def test_settings_from_env(environ: dict[str, str], expected: OutputSettings, notes: int) -> None:
    settings, messages = settings_from_env(environ)
    assert settings == expected
    assert len(messages) == notes
    assert all(ENV_LOG_LEVEL in m or ENV_LOG_FORMAT in m for m in messages)


@pytest.mark.parametrize(
    ("settings", "level"),
    [
        (OutputSettings(rank=0), logging.INFO),
        (OutputSettings(rank=1), logging.ERROR),
        (OutputSettings(rank=1, level="debug"), logging.DEBUG),
        (OutputSettings(rank=0, level="warning"), logging.WARNING),
    ],
    ids=["rank 0: info", "other ranks: errors only", "debug: every rank", "quieter on request"],
)
def test_root_level(settings: OutputSettings, level: int) -> None:
    assert settings.root_level == level


def test_a_python_warning_is_one_line_once_and_counted(restore_logging: None) -> None:
    out, stream = installed(OutputSettings(rank=0))
    for _ in range(5):
        warnings.warn("`all_gather_into_tensor` is deprecated", FutureWarning, stacklevel=1)
    logging.getLogger("finetune_trainer.progress").info("step 1/2")
    out.finish()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 3, lines
    expected = "[rank0] WARNING py.warnings: FutureWarning: `all_gather_into_tensor` is deprecated (test_trainer_output"
    assert expected in lines[0], lines
    assert "INFO finetune_trainer.progress: step 1/2" in lines[1]
    assert "1 warning repeated 4 more times" in lines[2]


def test_verbose_shows_every_warning_every_time(restore_logging: None) -> None:
    out, stream = installed(OutputSettings(rank=0, level="debug"))
    for _ in range(3):
        logging.getLogger("transformers.trainer").warning("same warning")
    out.finish()
    assert stream.getvalue().count("same warning") == 3
    assert "repeated" not in stream.getvalue()


def test_other_ranks_print_errors_only(restore_logging: None) -> None:
    out, stream = installed(OutputSettings(rank=1))
    warnings.warn("deprecated", FutureWarning, stacklevel=1)
    logging.getLogger("finetune_trainer").info("job started")
    logging.getLogger("finetune_trainer").warning("a warning")
    logging.getLogger("finetune_trainer").error("permanent error (exit 65)")
    out.finish()
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and "[rank1] ERROR finetune_trainer: permanent error (exit 65)" in lines[0], lines


def test_logger_names_are_not_cut(restore_logging: None) -> None:
    _, stream = installed(OutputSettings(rank=0))
    name = "finetune_trainer.a_rather_long_module_name.below_it"
    logging.getLogger(name).info("hello")
    assert f" {name}: hello" in stream.getvalue()


def test_transformers_logs_reach_our_handler(restore_logging: None) -> None:
    transformers_logging = pytest.importorskip("transformers.utils.logging")
    _, stream = installed(OutputSettings(rank=0))
    transformers_logging.get_logger("transformers.trainer").warning("from transformers")
    transformers_logging.get_logger("transformers.trainer").warning("from transformers")
    assert stream.getvalue().count("WARNING transformers.trainer: from transformers") == 1


def test_json_lines_carry_the_progress_fields(restore_logging: None) -> None:
    _, stream = installed(OutputSettings(rank=0, json=True))
    fields = {"step": 5, "max_steps": 30, "loss": 6.455}
    logging.getLogger("finetune_trainer.progress").info("step 5/30", extra={output.FIELDS: fields})
    warnings.warn("deprecated", FutureWarning, stacklevel=1)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "step 5/30" and first["logger"] == "finetune_trainer.progress"
    assert (first["level"], first["rank"]) == ("INFO", 0)
    assert (first["step"], first["max_steps"], first["loss"]) == (5, 30, 6.455)
    assert first["time"].endswith("+00:00")
    assert second["logger"] == "py.warnings" and second["message"].startswith("FutureWarning: deprecated (")


def test_warning_text_names_the_file_below_site_packages() -> None:
    path = "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py"
    text = warning_text(FutureWarning("x is deprecated"), FutureWarning, path, 83)
    assert text == "FutureWarning: x is deprecated (torch/distributed/c10d_logger.py:83)"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("settings", "stream", "expected"),
    [
        (OutputSettings(rank=0), Terminal(), True),
        (OutputSettings(rank=0), io.StringIO(), False),
        (OutputSettings(rank=1), Terminal(), False),
        (OutputSettings(rank=0, json=True), Terminal(), False),
    ],
    ids=["rank 0 in a terminal", "not a terminal (a pipe, a log file)", "another rank", "JSON output"],
)
def test_a_bar_only_on_rank_0_in_a_terminal(settings: OutputSettings, stream: io.StringIO, expected: bool) -> None:
    assert show_bar(settings, stream) is expected


def test_a_library_logger_with_its_own_handler_is_adopted(restore_logging: None) -> None:
    _, stream = installed(OutputSettings(rank=0))
    library = logging.getLogger("DeepSpeed")
    own = io.StringIO()
    saved = (list(library.handlers), library.propagate, library.level)
    library.addHandler(logging.StreamHandler(own))
    library.propagate = False
    library.setLevel(logging.WARNING)
    try:
        output.adopt_loggers(("DeepSpeed",))
        library.warning("zero stage 3 on CPU")
        library.warning("zero stage 3 on CPU")
        assert own.getvalue() == ""
        assert stream.getvalue().count("WARNING DeepSpeed: zero stage 3 on CPU") == 1
    finally:
        library.handlers[:], library.propagate = saved[0], saved[1]
        library.setLevel(saved[2])


def test_log_lines_go_above_a_live_bar(restore_logging: None) -> None:
    from finetune_trainer.progress import ProgressBar

    terminal = Terminal()
    installed_output = output.Output(OutputSettings(rank=0), terminal)  # the log handler on the bar's terminal
    installed_output.install()
    bar = ProgressBar(terminal)
    state = SimpleNamespace(is_world_process_zero=True, max_steps=4, global_step=0)
    bar.on_train_begin(None, state, None)
    state.global_step = 2
    bar.on_step_end(None, state, None)
    logging.getLogger("finetune_trainer.progress").info("step 2/4")
    bar.on_train_end(None, state, None)
    screen = terminal.getvalue()
    assert "2/4" in screen and "4/4" not in screen, screen  # the bar drew itself, at the step reached
    lines = [line for line in screen.replace("\r", "\n").splitlines() if "finetune_trainer.progress" in line]
    assert len(lines) == 1 and lines[0].endswith("INFO finetune_trainer.progress: step 2/4"), screen
    assert lines[0][:4].isdigit(), f"the log line shares a line with the bar: {lines[0]!r}"  # starts with its time
