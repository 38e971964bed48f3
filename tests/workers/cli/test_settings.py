"""Settings: flags > environment > TOML file > defaults; Redis URLs and password redaction."""

from __future__ import annotations

import io
import logging

import pytest

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.main import build_parser, subparsers
from streamnb_workers.cli.settings import redis_settings, resolve
from streamnb_workers.store.redaction import RedactingFilter, redact


def parsed(argv, env=None, command=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    subs = subparsers(parser)
    return resolve(subs[args.command], args, args.command, env=env or {}, all_parsers=subs)


@pytest.fixture
def toml(tmp_path):
    path = tmp_path / "streamnb.toml"
    path.write_text(
        'redis = "redis://file-host:6379/0"\n'
        "batch = 300\n"
        "block-ms = 700\n"
        'model = ["from-file"]\n'
        "[worker]\n"
        "batch = 400\n"
        "alpha = 0.25\n"
        "[produce]\n"
        "chunk = 9\n"
    )
    return path


def test_defaults_when_nothing_is_given():
    a = parsed(["worker"])
    assert (a.batch, a.block_ms, a.metrics_port, a.metrics_addr, a.model) == (200, 2000, 9500, "127.0.0.1", [])
    assert a.alpha is None and a.cluster is False and a.redis is None


def test_toml_table_overrides_top_level(toml):
    a = parsed(["worker", "--config", str(toml)])
    assert a.batch == 400  # [worker] beats top level
    assert a.block_ms == 700 and a.alpha == 0.25 and a.model == ["from-file"]
    assert a.redis == "redis://file-host:6379/0"
    # another command reads the same file: its own table, and top-level keys it knows
    p = parsed(["produce", "--config", str(toml)])
    assert p.chunk == 9 and p.redis == "redis://file-host:6379/0"


def test_env_beats_toml_and_flags_beat_env(toml):
    env = {"STREAMNB_BATCH": "50", "STREAMNB_REDIS_URL": "redis://env-host/1",
           "STREAMNB_MODEL": "a,b", "STREAMNB_CLUSTER": "yes"}
    a = parsed(["worker", "--config", str(toml)], env)
    assert a.batch == 50 and a.redis == "redis://env-host/1" and a.model == ["a", "b"]
    assert a.cluster is True
    a = parsed(["worker", "--config", str(toml), "--batch", "7", "--redis", "redis://flag/2",
                "--model", "x"], env)
    assert a.batch == 7 and a.redis == "redis://flag/2" and a.model == ["x"]


def test_config_file_from_env(toml):
    a = parsed(["worker"], {"STREAMNB_CONFIG": str(toml)})
    assert a.batch == 400


def test_bad_values_from_env_and_file(tmp_path):
    with pytest.raises(SettingsError, match="STREAMNB_BATCH: invalid value 'lots' for --batch"):
        parsed(["worker"], {"STREAMNB_BATCH": "lots"})
    with pytest.raises(SettingsError, match="--kind must be one of .*got 'svm'"):
        parsed(["worker"], {"STREAMNB_KIND": "svm"})
    with pytest.raises(SettingsError, match="--cluster expects true or false"):
        parsed(["worker"], {"STREAMNB_CLUSTER": "maybe"})
    bad = tmp_path / "bad.toml"
    bad.write_text("batch = = 3\n")
    with pytest.raises(SettingsError, match="is not valid TOML"):
        parsed(["worker", "--config", str(bad)])
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[worker]\nbtach = 3\n")
    with pytest.raises(SettingsError, match="unknown setting 'btach' in the \\[worker\\] table"):
        parsed(["worker", "--config", str(unknown)])
    typo = tmp_path / "typo.toml"
    typo.write_text("reddis = 'redis://x'\n")
    with pytest.raises(SettingsError, match="unknown setting 'reddis'"):
        parsed(["worker", "--config", str(typo)])
    with pytest.raises(SettingsError, match="does not exist"):
        parsed(["worker", "--config", str(tmp_path / "missing.toml")])
    secret = tmp_path / "secret.toml"
    secret.write_text("redis-password-file = '/x'\n")
    with pytest.raises(SettingsError, match="cannot be set in the config file"):
        parsed(["worker", "--config", str(secret)])


def test_redis_url_parts_and_password_sources(tmp_path):
    s = redis_settings("rediss://alice:p%3Aw@db.example:6380/3", env={})
    assert (s.username, s.password) == ("alice", "p:w")
    # the env password is used only when the URL has none
    s = redis_settings("redis://db:6379/0", env={"STREAMNB_REDIS_PASSWORD": "from-env"})
    assert s.password == "from-env"
    s = redis_settings("redis://:in-url@db:6379/0", env={"STREAMNB_REDIS_PASSWORD": "from-env"})
    assert s.password == "in-url"
    pw = tmp_path / "pw"
    pw.write_text("from-file\n")
    s = redis_settings("redis://:in-url@db/0", password_file=str(pw), env={"STREAMNB_REDIS_PASSWORD": "e"})
    assert s.password == "from-file"


@pytest.mark.parametrize("url, message", [
    ("http://db:6379", "expects a redis://, rediss:// or unix:// URL"),
    ("redis://db:notaport/0", "bad URL"),
    ("redis://db:6379/zero", "must be a number"),
    ("redis:///0", "has no host"),
    (None, "no Redis URL"),
])
def test_bad_redis_urls(url, message):
    with pytest.raises(SettingsError, match=message):
        redis_settings(url, env={})


def test_bad_url_error_does_not_show_the_password():
    with pytest.raises(SettingsError) as err:
        redis_settings("http://bob:topsecret@db", env={})
    assert "topsecret" not in str(err.value)


def test_passwords_are_redacted_in_log_lines(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("file-secret-42")
    redis_settings("redis://db/0", password_file=str(pw), env={})
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter())
    logger = logging.getLogger("test.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("auth with %s failed at %s", "file-secret-42", "rediss://u:other-secret@h:1/0")
        try:
            raise RuntimeError("boom file-secret-42")
        except RuntimeError:
            logger.exception("oops")
    finally:
        logger.removeHandler(handler)
    text = stream.getvalue()
    assert "file-secret-42" not in text and "other-secret" not in text
    assert "auth with *** failed at rediss://u:***@h:1/0" in text
    assert "boom ***" in text
    assert redact("plain text") == "plain text"


def test_on_off_flags_from_env_and_toml(tmp_path):
    """--foo/--no-foo options read true/false from the environment and TOML, not a string."""
    a = parsed(["worker"], {"STREAMNB_PREQUENTIAL": "false", "STREAMNB_LOWERCASE": "no"})
    assert a.prequential is False and a.lowercase is False
    assert parsed(["worker"], {"STREAMNB_PREQUENTIAL": "on"}).prequential is True
    assert parsed(["worker"]).prequential is True
    cfg = tmp_path / "c.toml"
    cfg.write_text("[worker]\nprequential = false\nlabel-cache-ttl = 3600\n")
    b = parsed(["worker", "--config", str(cfg)])
    assert b.prequential is False and b.label_cache_ttl == 3600.0
    assert parsed(["worker", "--config", str(cfg), "--prequential"]).prequential is True
    with pytest.raises(SettingsError, match="--prequential expects true or false"):
        parsed(["worker"], {"STREAMNB_PREQUENTIAL": "maybe"})


def test_pipeline_flag_reaches_the_worker_options(tmp_path):
    from streamnb_workers.cli.supervisor import worker_options

    assert worker_options(parsed(["worker"])).send_ahead is True
    assert worker_options(parsed(["worker", "--no-pipeline"])).send_ahead is False
    assert worker_options(parsed(["worker"], {"STREAMNB_PIPELINE": "off"})).send_ahead is False


def test_cache_labelled_flag_reaches_the_worker_options():
    from streamnb_workers.cli.supervisor import worker_options

    assert worker_options(parsed(["worker"])).cache_labelled is True
    assert worker_options(parsed(["worker", "--no-cache-labelled"])).cache_labelled is False


def test_learnt_keys_max_reaches_the_worker_options():
    from streamnb_workers.cli.supervisor import worker_options

    assert worker_options(parsed(["worker"])).learnt_keys_max == 250_000
    assert worker_options(parsed(["worker", "--learnt-keys-max", "0"])).learnt_keys_max == 0
    env = {"STREAMNB_LEARNT_KEYS_MAX": "1000"}
    assert worker_options(parsed(["worker"], env)).learnt_keys_max == 1000


def test_log_keep_reaches_the_worker_options_as_the_trim_margin():
    from streamnb_workers.cli.supervisor import worker_options

    assert worker_options(parsed(["worker"])).trim_margin_ms == 60_000
    assert worker_options(parsed(["worker", "--log-keep", "86400"])).trim_margin_ms == 86_400_000
    env = {"STREAMNB_LOG_KEEP": "0.5"}
    assert worker_options(parsed(["worker"], env)).trim_margin_ms == 500


def test_the_operating_point_from_a_file_and_the_environment_reaches_the_model_spec(tmp_path):
    from streamnb_workers.cli.options import model_specs

    path = tmp_path / "op.toml"
    path.write_text('model = ["mail"]\n[worker]\ntarget-fpr = 0.001\ncalibration = "platt"\n')
    a = parsed(["worker", "--config", str(path)], {"STREAMNB_SCORE_WINDOW": "5000"})
    (spec,) = model_specs(a)
    assert spec.decision == {"target_fpr": 0.001, "calibration": "platt", "score_window": 5000}

def test_the_bounds_reach_the_worker_options_and_training_the_spec(capsys):
    from streamnb_workers.cli.options import model_specs
    from streamnb_workers.cli.supervisor import worker_options

    limits = worker_options(parsed(["worker"])).limits
    assert (limits.max_weight, limits.max_value) == (1e6, 1e100)
    limits = worker_options(parsed(["worker", "--max-weight", "50"],
                                   {"STREAMNB_MAX_VALUE": "1e9"})).limits
    assert (limits.max_weight, limits.max_value) == (50.0, 1e9)
    for bad in ("0", "-1", "inf"):
        with pytest.raises(SystemExit):
            parsed(["worker", "--max-weight", bad])
        assert "argument --max-weight: expected a " in capsys.readouterr().err
    args = parsed(["worker", "--model", "m", "--training", "train"])
    assert model_specs(args)[0].training == "train"
    assert model_specs(parsed(["worker", "--model", "m"]))[0].training is None
    with pytest.raises(SystemExit):
        parsed(["worker", "--training", "both"])
    assert "argument --training: invalid choice: 'both'" in capsys.readouterr().err
