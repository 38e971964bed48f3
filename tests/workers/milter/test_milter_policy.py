"""The milter's headers, score and policy, and its command line (no Redis, no MTA)."""

from __future__ import annotations

import math
from email.header import decode_header

import numpy as np
import pytest
from prometheus_client import CollectorRegistry
from scipy.special import logsumexp

from streamnb_workers.cli.commands.milter import parse_listen
from streamnb_workers.cli.main import main
from streamnb_workers.client.verdicts import (
    ID_HEADER,
    SCORE_HEADER,
    TOKENS_HEADER,
    VERDICT_HEADER,
    NotScored,
    format_score,
    log_odds,
    not_scored_headers,
    verdict_headers,
)
from streamnb_workers.milter.policy import (
    Outcome,
    Policy,
    Reply,
    decide,
    parse_reply,
    parse_verdict_actions,
)
from streamnb_workers.observe.metrics import MilterMetrics


def _pred(label, **probs):
    return {"label": label, "log_proba": {k: math.log(v) for k, v in probs.items()}}


# ----------------------------------------------------------------------------- score
def test_log_odds_two_classes_by_hand():
    # P(spam) = 0.9: odds 9, log 9 = 2.1972...
    assert log_odds({"ham": math.log(0.1), "spam": math.log(0.9)}) == pytest.approx(math.log(9))
    assert log_odds({"ham": math.log(0.1), "spam": math.log(0.9)}, "ham") == \
        pytest.approx(-math.log(9))


def test_log_odds_against_all_other_classes():
    lp = np.log([0.2, 0.5, 0.3])
    got = log_odds(dict(zip(["a", "b", "c"], lp, strict=True)), "b")
    assert got == pytest.approx(lp[1] - logsumexp(lp[[0, 2]]))
    assert got == pytest.approx(0.0)  # 0.5 against 0.2 + 0.3


def test_log_odds_default_positive_is_the_last_sorted_class_and_ints_match_text():
    lp = {"spam": math.log(0.75), "ham": math.log(0.25)}
    assert log_odds(lp) == pytest.approx(math.log(3))  # spam, whatever the map's order
    assert log_odds({0: math.log(0.25), 1: math.log(0.75)}) == pytest.approx(math.log(3))
    assert log_odds({0: math.log(0.25), 1: math.log(0.75)}, "0") == pytest.approx(-math.log(3))


def test_log_odds_stays_finite_where_probabilities_underflow():
    # log posteriors of a long mail: exp() of either is 0 in float64
    lp = {"ham": -1500.0, "spam": 0.0}
    assert log_odds(lp) == 1500.0
    assert log_odds({"ham": 0.0, "spam": -1500.0}) == -1500.0


def test_log_odds_edge_cases():
    assert log_odds({"spam": 0.0}) == math.inf  # a one-class model
    assert log_odds({"ham": -math.inf, "spam": 0.0}) == math.inf
    with pytest.raises(ValueError, match="not one of"):
        log_odds({"ham": -1.0, "spam": -0.5}, "news")
    with pytest.raises(ValueError, match="no score"):
        log_odds({})


def test_format_score():
    assert [format_score(v) for v in (2.0049, -0.004, 1500.0, math.inf, -math.inf)] == \
        ["2.00", "-0.00", "1500.00", "inf", "-inf"]


# --------------------------------------------------------------------------- headers
def test_verdict_headers():
    h = verdict_headers(_pred("spam", ham=0.1, spam=0.9), msg_id="milter-Q1-abc")
    assert h == [(VERDICT_HEADER, "spam"), (SCORE_HEADER, "2.20"), (ID_HEADER, "milter-Q1-abc")]
    h = verdict_headers({**_pred("ham", ham=0.8, spam=0.2), "top_tokens": ["lunch", "agenda"]})
    assert h == [(VERDICT_HEADER, "ham"), (SCORE_HEADER, "-1.39"), (TOKENS_HEADER, "lunch agenda")]


def test_a_label_that_is_not_printable_ascii_is_encoded_not_injected():
    h = dict(verdict_headers(_pred("sp\r\nBcc: x@evil", **{"sp\r\nBcc: x@evil": 0.9, "ham": 0.1})))
    value = h[VERDICT_HEADER]
    assert "\r" not in value and "\n" not in value and value.startswith("=?utf-8?")
    text, charset = decode_header(value)[0]
    assert text.decode(charset) == "sp\r\nBcc: x@evil"
    value = dict(verdict_headers(_pred("pourriel", pourriel=0.9, courriel=0.1), "courriel"))
    assert value[SCORE_HEADER] == "-2.20"
    assert dict(verdict_headers(_pred("спам", спам=0.9, хам=0.1)))[VERDICT_HEADER].startswith("=?utf-8?")


def test_a_prediction_without_a_label_is_not_scored():
    with pytest.raises(NotScored) as info:
        verdict_headers({"label": None, "log_proba": {}})
    assert info.value.reason == "untrained"


def test_not_scored_headers():
    assert not_scored_headers("redis-unavailable", "milter-1") == [
        (VERDICT_HEADER, "not-scored (redis-unavailable)"), (ID_HEADER, "milter-1")]


# ---------------------------------------------------------------------------- policy
def test_parse_verdict_actions_errors():
    for bad in ("spam", "=reject", "spam=", "spam=bounce"):
        with pytest.raises(ValueError, match="--verdict-action"):
            parse_verdict_actions([bad])
    assert parse_verdict_actions([]) == {}


def test_parse_reply():
    assert parse_reply("451 4.3.0 later, please", "4") == Reply("451", "4.3.0", "later, please")
    for bad, klass in (("550 5.7.1", "5"), ("550 4.7.1 mixed", "5"), ("250 2.0.0 ok", "5"),
                       ("550 5.7.1 caf\u00e9", "5"), ("550 5.7.1 two\nlines", "5"),
                       ("5.7.1 550 swapped", "5"), ("451 4.7.1 later", "5"),
                       ("550 5.7.1 100% spam", "5")):
        with pytest.raises(ValueError, match=f"expected a {klass}xx reply"):
            parse_reply(bad, klass)


def test_policy_checks_its_actions():
    with pytest.raises(ValueError, match="verdict actions"):
        Policy(actions={"spam": "tempfail"})
    with pytest.raises(ValueError, match="on_failure"):
        Policy(on_failure="reject")


def test_decide_per_verdict():
    policy = Policy(actions={"spam": "reject", "unsure": "quarantine"})
    spam = decide(policy, _pred("spam", ham=0.01, spam=0.99), "m1")
    assert (spam.action, spam.verdict, spam.failure, str(spam.reply)) == \
        ("reject", "spam", None, "550 5.7.1 Message rejected as spam")
    unsure = decide(policy, _pred("unsure", ham=0.45, spam=0.55), "m2")
    assert (unsure.action, unsure.reply, unsure.reason) == ("quarantine", None, "verdict unsure")
    assert dict(unsure.headers)[VERDICT_HEADER] == "unsure"
    ham = decide(policy, _pred("ham", ham=0.99, spam=0.01), "m3")
    assert ham.action == "accept" and dict(ham.headers)[ID_HEADER] == "m3"
    # an integer label is matched by its text
    assert decide(Policy(actions={"1": "reject"}), _pred(1, **{"0": 0.1, "1": 0.9}), "m4").action \
        == "reject"


def test_decide_when_not_scored():
    accept = decide(Policy(), None, "m1", NotScored("timeout", "no prediction within 2 s"))
    assert accept == Outcome("accept", ((VERDICT_HEADER, "not-scored (timeout)"), (ID_HEADER, "m1")),
                             failure="timeout")
    assert accept.reason == "not scored (timeout)"
    tempfail = decide(Policy(on_failure="tempfail"), None, None, NotScored("redis-unavailable"))
    assert (tempfail.action, tempfail.headers, str(tempfail.reply)) == \
        ("tempfail", (), "451 4.7.1 Message not scored by streamnb, try again later")
    # a model without classes yet, and a --positive that names none of its classes
    untrained = decide(Policy(actions={"spam": "reject"}), {"label": None, "log_proba": {}}, "m2")
    assert (untrained.action, untrained.failure) == ("accept", "untrained")
    wrong = decide(Policy(positive="news"), _pred("spam", ham=0.1, spam=0.9), "m3")
    assert (wrong.action, wrong.failure) == ("accept", "error")


def test_metrics_count_outcomes():
    reg = CollectorRegistry()
    m = MilterMetrics(reg)
    m.observe("mail", decide(Policy(actions={"spam": "reject"}), _pred("spam", ham=0.1, spam=0.9),
                             "m1"), 0.004)
    m.observe("mail", decide(Policy(), None, "m2", NotScored("timeout")), 2.0)
    get = reg.get_sample_value
    assert get("streamnb_milter_mails_total",
               {"model": "mail", "verdict": "spam", "action": "reject"}) == 1.0
    assert get("streamnb_milter_mails_total",
               {"model": "mail", "verdict": "not-scored", "action": "accept"}) == 1.0
    assert get("streamnb_milter_not_scored_total", {"model": "mail", "reason": "timeout"}) == 1.0
    assert get("streamnb_milter_decision_seconds_count", {"model": "mail"}) == 2.0
    assert get("streamnb_milter_decision_seconds_bucket", {"model": "mail", "le": "0.005"}) == 1.0


# ------------------------------------------------------------------------ command line
def test_parse_listen():
    assert parse_listen(" inet6:8894@[::1] ") == ("inet6:8894@[::1]", None)
    assert parse_listen("local:/var/run/m.sock") == ("local:/var/run/m.sock", "/var/run/m.sock")
    assert parse_listen("inet:8894") == ("inet:8894", None)
    for bad in ("inet:0@127.0.0.1", "inet:70000@127.0.0.1", "unix:relative.sock", "tcp:25",
                "inet:@127.0.0.1", ""):
        with pytest.raises(ValueError, match="--listen"):
            parse_listen(bad)


@pytest.mark.parametrize("argv, message", [
    (["--redis", "redis://127.0.0.1:1/0"], "--model NAME is required"),
    (["--model", "mail"], "no Redis URL"),
    (["--model", "mail", "--redis", "redis://127.0.0.1:1/0", "--listen", "127.0.0.1:25"],
     "--listen expects"),
    (["--model", "mail", "--redis", "redis://127.0.0.1:1/0", "--verdict-action", "spam=bounce"],
     "the action must be one of"),
    (["--model", "mail", "--redis", "redis://127.0.0.1:1/0", "--reject-reply", "451 4.7.1 no"],
     "--reject-reply: expected a 5xx reply"),
    (["--model", "mail", "--redis", "redis://127.0.0.1:1/0", "--on-failure", "reject"],
     "invalid choice"),
    (["--model", "mail", "--redis", "redis://127.0.0.1:1/0", "--timeout", "0"],
     "expected seconds in"),
    (["--model", "mail", "--redis", "redis://127.0.0.1:1/0", "--max-size", "2000000"],
     "expected 1024..1000000 bytes"),
    (["--model", "mail", "--redis", "redis://127.0.0.1:1/0", "--socket-mode", "999"],
     "expected an octal mode"),
])
def test_bad_settings_are_one_line_and_exit_2(capsys, argv, message):
    try:
        code = main(["milter", *argv], env={})
    except SystemExit as exc:  # argparse's own errors (a type or a choice)
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_settings_from_the_environment(capsys):
    env = {"STREAMNB_MODEL": "mail", "STREAMNB_REDIS_URL": "redis://127.0.0.1:1/0",
           "STREAMNB_VERDICT_ACTION": "spam=reject,unsure=drop"}
    assert main(["milter"], env=env) == 2
    assert "--verdict-action unsure=drop" in capsys.readouterr().err


def test_not_scored_warnings_are_one_per_reason_and_minute(caplog):
    from streamnb_workers.milter.policy import _OncePerReason

    quiet = _OncePerReason(every_s=60.0)
    with caplog.at_level("WARNING", logger="streamnb.milter"):
        for i in range(5):
            quiet.warn(f"m{i}", NotScored("redis-unavailable", "ConnectionError"))
        quiet.warn("m5", NotScored("timeout"))
    assert [r.getMessage() for r in caplog.records] == [
        "mail m0 not scored: redis-unavailable: ConnectionError", "mail m5 not scored: timeout"]
    caplog.clear()
    quiet.every_s = 0.0
    with caplog.at_level("WARNING", logger="streamnb.milter"):
        quiet.warn("m6", NotScored("redis-unavailable", "ConnectionError"))
    assert caplog.records[0].getMessage() == ("mail m6 not scored: redis-unavailable: "
                                              "ConnectionError (4 more not scored for this "
                                              "reason since the last message)")
