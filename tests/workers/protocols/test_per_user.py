"""Per-user models by recipient, end to end: a real redis-server, a worker of "mail" with
``--per-user``, ``streamnb spamd`` and ``streamnb rspamd`` with ``--per-user`` and the real
``spamc`` (``-u``) and ``rspamc`` (``-d``), pipe mode (``predict - --user``), and the milter
behind a real Postfix (RCPT TO). Each routes to the right model; a user's verdict is that
of one model fitted offline on the global mail and the user's together; below the minimum
weight the user's part is left out."""

from __future__ import annotations

import email
import re
import signal
import socket
import urllib.request

import numpy as np
import pytest

from streamnb_workers.store.keys import ModelKeys
from streamnb_workers.store.model_config import read_config
from streamnb_workers.store.user_models import UserNames, user_models
from streamnb_workers.wire.codec import decode_input, encode_input
from streamnb_workers.wire.outputs import decode_output
from tests.helpers.milter import K, MilterProcess, mail, training_mails, wait_for
from tests.helpers.protocols import (
    RSPAMC,
    SPAMC,
    ServerProcess,
    model_stats,
    protocol_servers,
    rspamc,
    run_client,
    same_stats,
    spamc,
)
from tests.helpers.redis_server import free_port
from tests.helpers.workers import PYTHON, per_class

pytestmark = [pytest.mark.redis,
              pytest.mark.skipif(SPAMC is None or RSPAMC is None,
                                 reason="spamc and rspamc are not installed")]

PASSWORD = "s3cret"
MIN_WEIGHT = 3
NAMES = UserNames("mail")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A trained model whose worker serves per-user models (a user's part counts from
    weight 3), spamd with TELL and rspamd with a learning password, both ``--per-user``."""
    logs = tmp_path_factory.mktemp("per-user")
    (logs / "password").write_text(PASSWORD + "\n")
    with protocol_servers(logs, [
            ("spamd", "spamd.log", ("--allow-tell", "--per-user")),
            ("rspamd", "rspamd.log", ("--per-user", "--password-file", str(logs / "password")))],
            per_user_s=0.05, user_min_weight=MIN_WEIGHT) as (redis_server, (spamd, rspamd)):
        yield redis_server, spamd, rspamd


def checked(server, r, user: str, raw: bytes) -> tuple[str, dict]:
    """PROCESS ``raw`` for ``user`` through spamd: the model that scored it and its
    prediction (found by the X-Streamnb-Id of the reply in that model's ``:out``)."""
    request = b"PROCESS SPAMC/1.5\r\nUser: %s\r\nContent-length: %d\r\n\r\n%s" % (
        user.encode(), len(raw), raw)
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(request)
        s.shutdown(socket.SHUT_WR)
        reply = b"".join(iter(lambda: s.recv(65536), b""))
    msg_id = re.search(rb"X-Streamnb-Id: (\S+)", reply)[1].decode()
    return prediction_of(r, msg_id)


def prediction_of(r, msg_id: str) -> tuple[str, dict]:
    for model in ["mail", *user_models(r, "mail")]:
        for _, fields in r.xrange(ModelKeys(model).out):
            out = decode_output(fields[b"data"])
            if out.get("id") == msg_id:
                return model, out
    raise AssertionError(f"no prediction with id {msg_id}")


def fitted_offline(r, mails):
    """One model of "mail"'s config fitted on ``mails`` (raw, label), and its featurizer."""
    cfg = read_config(r, "mail")
    model, featurizer = cfg.make_model(), cfg.make_featurizer()
    X = featurizer.stack([featurizer.featurize(decode_input(encode_input("raw", raw), "1-0")
                                               .as_payload()) for raw, _ in mails])
    model.partial_fit(X, [label for _, label in mails])
    return model, featurizer


def offline_log_proba(model, featurizer, raw) -> dict:
    X = featurizer.stack([featurizer.featurize(decode_input(encode_input("raw", raw), "1-0")
                                               .as_payload())])
    return dict(zip(model.classes_, model.predict_log_proba(X)[0], strict=True))


def test_spamc_u_learns_into_the_users_model_and_scores_with_it(servers):
    redis_server, spamd, _ = servers
    r = redis_server.client()
    before = model_stats(r)
    alice = NAMES.user("alice@example.org")
    assert alice == "mail.u.alice_40example.org"
    learn = spamc(spamd, "-u", "Alice@Example.org", "-L", "spam", mail_bytes=mail("ham", 5000))
    assert learn.stdout == b"Message successfully un/learned\n", learn
    assert alice in user_models(r, "mail")
    assert model_stats(r, alice)["classes"] == {"spam": np.array([1.0])}
    same_stats(model_stats(r), before)  # the global model learnt nothing
    wait_for(lambda: r.hexists(ModelKeys(alice).workers, "w1"), 30, "the worker to serve alice")
    # alice's mail goes to her model; bob (no model), root (a name) and no user to the global
    assert checked(spamd, r, "alice@example.org", mail("spam", 5001))[0] == alice
    assert checked(spamd, r, "<alice@example.org>", mail("spam", 5002))[0] == alice
    for user in ("bob@example.org", "root"):
        assert checked(spamd, r, user, mail("spam", 5003))[0] == "mail"
    assert spamc(spamd, "-c", "-u", "alice@example.org", mail_bytes=mail("spam", 5004)
                 ).returncode == 1


def test_below_the_minimum_weight_the_users_part_is_left_out(servers):
    redis_server, spamd, _ = servers
    r = redis_server.client()
    carol = NAMES.user("carol@example.org")
    for seed in (5100, 5101):  # weight 2 < 3: ham mail learnt as spam, twice
        assert spamc(spamd, "-u", "carol@example.org", "-L", "spam",
                     mail_bytes=mail("ham", seed)).returncode == 0
    assert float(model_stats(r, carol)["classes"]["spam"][0]) == 2.0 < MIN_WEIGHT
    wait_for(lambda: r.hexists(ModelKeys(carol).workers, "w1"), 30, "the worker to serve carol")
    raw = mail("ham", 5102)
    model, hers = checked(spamd, r, "carol@example.org", raw)
    assert model == carol
    _, global_one = checked(spamd, r, "root", raw)
    assert hers["log_proba"] == global_one["log_proba"]  # the global verdict, bit for bit
    assert hers["label"] == global_one["label"] == "ham"


def test_rspamc_d_learns_and_a_users_verdict_is_one_models_fitted_on_the_union(servers):
    redis_server, spamd, rspamd = servers
    r = redis_server.client()
    dave = NAMES.user("dave@example.org")
    taught = [(mail("ham", 5200 + i), "spam") for i in range(3)] + [(mail("spam", 5210), "ham")]
    for raw, label in taught:
        got = rspamc(rspamd, "-P", PASSWORD, "-d", "dave@example.org", f"learn_{label}",
                     mail_bytes=raw)
        assert got.returncode == 0, got
    assert model_stats(r, dave)["classes"] == {"ham": np.array([1.0]), "spam": np.array([3.0])}
    wait_for(lambda: r.hexists(ModelKeys(dave).workers, "w1"), 30, "the worker to serve dave")
    # the global model is what the worker learnt of the training mails
    union, featurizer = fitted_offline(r, training_mails(60) + taught)
    global_only, _ = fitted_offline(r, training_mails(60))
    same_stats(model_stats(r), per_class(global_only))
    # rspamc -d scores with dave's model: his prediction is the union's
    symbols = rspamc(rspamd, "-d", "dave@example.org", "symbols", mail_bytes=mail("ham", 5220))
    assert symbols.returncode == 0, symbols
    out = decode_output(r.xrevrange(ModelKeys(dave).out, count=1)[0][1][b"data"])
    expected = offline_log_proba(union, featurizer, mail("ham", 5220))
    assert out["log_proba"].keys() == expected.keys()
    for label, value in expected.items():
        assert out["log_proba"][label] == pytest.approx(value, abs=1e-9, rel=1e-12)
    # and it differs from the global model's: dave's statistics counted
    alone = offline_log_proba(global_only, featurizer, mail("ham", 5220))
    assert out["log_proba"]["spam"] != pytest.approx(alone["spam"], abs=1e-6)
    # through spamd too, for the same mail
    _, again = checked(spamd, r, "dave@example.org", mail("ham", 5220))
    assert again["log_proba"] == out["log_proba"]


def test_pipe_mode_user_routes_to_the_users_model(servers, tmp_path):
    redis_server, spamd, _ = servers
    r = redis_server.client()
    erin = NAMES.user("erin@example.org")
    assert spamc(spamd, "-u", "erin@example.org", "-L", "ham",
                 mail_bytes=mail("ham", 5300)).returncode == 0
    wait_for(lambda: r.hexists(ModelKeys(erin).workers, "w1"), 30, "the worker to serve erin")
    mine, theirs = r.xlen(ModelKeys(erin).out), r.xlen(K.out)
    argv = [PYTHON, "-m", "streamnb_workers", "predict", "--redis", redis_server.url,
            "--model", "mail", "--timeout", "20", "-p", "--user", "erin@example.org", "-"]
    got = run_client(argv, mail("spam", 5301))
    assert got.returncode in (0, 1), got
    assert b"X-Streamnb-Verdict: spam" in got.stdout
    assert (r.xlen(ModelKeys(erin).out), r.xlen(K.out)) == (mine + 1, theirs)
    nobody = run_client([*argv[:-3], "--user", "nobody@example.net", "-"], mail("spam", 5302))
    assert nobody.returncode in (0, 1), nobody
    assert (r.xlen(ModelKeys(erin).out), r.xlen(K.out)) == (mine + 1, theirs + 1)
    bad = run_client([*argv[:-3], "--user", "x@y", "/dev/null"])
    assert bad.returncode == 2 and b"--user" in bad.stderr


@pytest.mark.slow
def test_the_milter_scores_for_the_recipients_model_behind_postfix(servers, tmp_path):
    pytest.importorskip("Milter", reason="the milter needs pymilter")
    from benchmarks.postfix_instance import PostfixInstance, unavailable

    if unavailable() is not None:
        pytest.skip(unavailable())
    redis_server, spamd, _ = servers
    r = redis_server.client()
    frank = NAMES.user("frank@streamnb.test")
    assert spamc(spamd, "-u", "frank@streamnb.test", "-L", "ham",
                 mail_bytes=mail("ham", 5400)).returncode == 0
    wait_for(lambda: r.hexists(ModelKeys(frank).workers, "w1"), 30, "the worker to serve frank")
    port = free_port()
    with MilterProcess(redis_server.url, tmp_path / "milter.log", "--per-user", port=port,
                       timeout=10.0) as milter, \
            PostfixInstance(free_port(), f"inet:127.0.0.1:{port}") as postfix:
        for recipients, model in ((["frank@streamnb.test"], frank),
                                  (["someone@streamnb.test"], "mail"),
                                  (["frank@streamnb.test", "someone@streamnb.test"], "mail")):
            n = len(postfix.delivered())
            raw = mail("ham", 5401 + n)
            with postfix.connect() as smtp:
                smtp.sendmail("sender@example.org", recipients, raw)
            wait_for(lambda n=n: len(postfix.delivered()) > n, 30,
                     f"delivery ({postfix.log()[-2000:]})")
            got = email.message_from_bytes(postfix.delivered()[-1])
            assert prediction_of(r, got["X-Streamnb-Id"])[0] == model, (recipients, milter.log())
        milter.stop(signal.SIGTERM)


def test_past_max_users_learning_goes_to_the_domain_then_the_global_model(servers, tmp_path):
    """A spamd whose registry bound leaves one place: ``@full.test`` takes it, then a new
    user of that domain learns into the domain's model and one of another domain into
    the global model; the registry does not grow and the metric counts both."""
    redis_server, _, _ = servers
    r = redis_server.client()
    registered = set(user_models(r, "mail"))
    metrics_port = free_port()
    with ServerProcess("spamd", redis_server.url, tmp_path / "full.log", "--allow-tell",
                       "--per-user", "--max-users", str(len(registered) + 1),
                       "--metrics-port", str(metrics_port)) as spamd:
        domain = NAMES.domain("full.test")
        assert spamc(spamd, "-u", "@full.test", "-L", "spam",
                     mail_bytes=mail("ham", 5400)).returncode == 0
        assert set(user_models(r, "mail")) == registered | {domain}
        learnt = spamc(spamd, "-u", "zed@full.test", "-L", "spam", mail_bytes=mail("ham", 5401))
        assert learnt.stdout == b"Message successfully un/learned\n", learnt
        assert float(model_stats(r, domain)["classes"]["spam"][0]) == 2.0
        before = model_stats(r)
        assert spamc(spamd, "-u", "zed@else.test", "-L", "spam",
                     mail_bytes=mail("ham", 5402)).returncode == 0
        after = model_stats(r)
        assert float(after["classes"]["spam"][0]) == float(before["classes"]["spam"][0]) + 1
        assert set(user_models(r, "mail")) == registered | {domain}
        assert not r.exists(ModelKeys(NAMES.user("zed@full.test")).config)
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as f:
            text = f.read().decode()
        assert re.search(r"^streamnb_user_models_full_total 2\.0$", text, re.M), text
