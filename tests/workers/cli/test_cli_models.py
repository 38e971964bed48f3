"""``produce``, ``predict`` and ``status`` refuse a model that does not exist, in one line
naming the models that do (exit 2); ``produce --allow-new`` sends anyway; a database number
the server does not have is a bad ``--redis`` (one line, exit 2). Real redis-server, real
``streamnb`` processes."""

from __future__ import annotations

import time

import pytest

from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import ModelSpec, ensure_config
from tests.helpers.acl import cli, one_line_failure

pytestmark = pytest.mark.redis


@pytest.fixture
def two_models(redis_server):
    r = redis_server.client()
    for name in ("mail", "news"):
        ensure_config(r, ModelSpec(name, kind="multinomial"))
    return redis_server


def test_produce_refuses_a_model_that_does_not_exist(two_models, tmp_path):
    records = tmp_path / "in.jsonl"
    records.write_text('{"text": "cheap meds", "label": "spam"}\n')
    line = one_line_failure(cli("produce", "--redis", two_models.url, "--model", "mial", str(records)))
    assert "model 'mial' does not exist" in line
    assert "models in this Redis database: mail, news" in line and "--allow-new" in line
    r = two_models.client()
    assert not r.exists(ModelKeys("mial").input), "a refused produce wrote nothing"

    p = cli("produce", "--redis", two_models.url, "--model", "fresh", "--allow-new", str(records))
    assert p.returncode == 0, p.stderr
    assert r.xlen(ModelKeys("fresh").input) == 1
    p = cli("produce", "--redis", two_models.url, "--model", "mail", str(records))
    assert p.returncode == 0 and r.xlen(ModelKeys("mail").input) == 1


def test_predict_and_status_refuse_at_once(two_models, tmp_path):
    mail = tmp_path / "m.eml"
    mail.write_text("Subject: hi\n\nhello\n")
    t0 = time.monotonic()
    line = one_line_failure(cli("predict", "--redis", two_models.url, "--model", "typo",
                                "--timeout", "30", str(mail)))
    assert time.monotonic() - t0 < 20, "predict waited out its timeout"
    assert "model 'typo' does not exist" in line and "mail, news" in line
    assert not two_models.client().exists(ModelKeys("typo").input)
    for extra in ([], ["--json"]):
        line = one_line_failure(cli("status", "--redis", two_models.url, "--model", "typo", *extra))
        assert "model 'typo' does not exist" in line and "mail, news" in line


def test_an_empty_database_says_so(redis_server):
    line = one_line_failure(cli("status", "--redis", redis_server.url, "--model", "mail"))
    assert "this Redis database holds no model" in line


@pytest.mark.parametrize("command", [["status"], ["produce", "--allow-new", "no-such.eml"],
                                     ["worker", "--kind", "multinomial", "--metrics-port", "0"]])
def test_a_database_number_the_server_lacks_exits_2(redis_server, command):
    url = f"redis://127.0.0.1:{redis_server.port}/99"
    line = one_line_failure(cli(*command[:1], "--redis", url, "--model", "mail", *command[1:]))
    assert "database number does not exist" in line


def test_a_user_without_scan_is_told_the_model_is_missing(two_models):
    r = two_models.client()
    r.execute_command("ACL", "SETUSER", "noscan", "on", ">noscan-pw", "~*", "+@all", "-scan")
    url = f"redis://noscan:noscan-pw@127.0.0.1:{two_models.port}/0"
    line = one_line_failure(cli("status", "--redis", url, "--model", "typo"))
    assert "model 'typo' does not exist" in line and "may not list" in line
    assert cli("status", "--redis", url, "--model", "mail").returncode == 0
