"""get_logger: INFO from the chosen ranks only, WARNING from every rank, the rank on each line."""

import logging
import uuid

import pytest

from twinkle import get_logger


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in ("RANK", "TWINKLE_LOG_RANKS", "TWINKLE_LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)


def fresh_name():
    """A logger family configured for the first time (the level is read then)."""
    return f"twinkle_test_{uuid.uuid4().hex}"


def emit(capsys, logger):
    logger.debug("debug line")
    logger.info("info line")
    logger.warning("warning line")
    return capsys.readouterr().err


def test_rank_0_shows_info_with_its_rank(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    err = emit(capsys, get_logger())
    assert "[rank 0] INFO twinkle: info line" in err
    assert "warning line" in err
    assert "debug line" not in err


def test_other_ranks_show_warnings_only(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    err = emit(capsys, get_logger("twinkle.model"))
    assert "info line" not in err
    assert "[rank 1] WARNING twinkle.model: warning line" in err


@pytest.mark.parametrize(
    ("ranks", "rank", "shown"), [("all", 5, True), ("0,3", 3, True), ("0,3", 1, False)]
)
def test_twinkle_log_ranks_chooses_who_shows_info(monkeypatch, capsys, ranks, rank, shown):
    monkeypatch.setenv("TWINKLE_LOG_RANKS", ranks)
    monkeypatch.setenv("RANK", str(rank))
    assert ("info line" in emit(capsys, get_logger())) is shown


def test_a_bad_rank_list_is_an_error(monkeypatch):
    monkeypatch.setenv("TWINKLE_LOG_RANKS", "first")
    with pytest.raises(ValueError, match="use 'all' or comma-separated ranks"):
        get_logger().info("x")


def test_twinkle_log_level_sets_the_level(monkeypatch, capsys):
    monkeypatch.setenv("TWINKLE_LOG_LEVEL", "debug")
    assert "debug line" in emit(capsys, get_logger(fresh_name()))
    monkeypatch.setenv("TWINKLE_LOG_LEVEL", "WARNING")
    err = emit(capsys, get_logger(fresh_name()))
    assert "info line" not in err and "warning line" in err


def test_a_bad_level_is_an_error(monkeypatch):
    monkeypatch.setenv("TWINKLE_LOG_LEVEL", "LOUD")
    with pytest.raises(ValueError, match="not a logging level"):
        get_logger(fresh_name())


def test_one_handler_per_family_and_no_duplicate_lines(capsys):
    root = logging.getLogger()
    seen = []
    spy = logging.Handler()
    spy.emit = seen.append
    root.addHandler(spy)
    try:
        name = fresh_name()
        get_logger(name)
        child = get_logger(f"{name}.child")
        child.info("once")
    finally:
        root.removeHandler(spy)
    assert capsys.readouterr().err.count("once") == 1
    assert seen == []
    assert len(logging.getLogger(name).handlers) == 1
    assert logging.getLogger(f"{name}.child").handlers == []
