"""Every request's user goes through one ``ModelChooser``: learning from an address
creates and fills its own model, and checks and forgets go to it once it is registered
(no worker here: what is looked at is where each mail was sent)."""

from __future__ import annotations

import msgpack
import pytest

from streamnb_workers.milter.policy import Policy
from streamnb_workers.protocols.mail_service import MailService, Scale
from streamnb_workers.protocols.users import ModelChooser, UserNames
from streamnb_workers.store.connection import RedisSettings
from streamnb_workers.store.keys import ModelKeys
from tests.helpers.milter import mail

pytestmark = pytest.mark.redis


@pytest.fixture
def service(redis_server):
    chooser = ModelChooser("mail", UserNames("mail"))
    svc = MailService(RedisSettings(redis_server.url), chooser, policy=Policy(),
                      scale=Scale(), timeout=0.2, max_size=65536, id_prefix="spamd")
    yield svc
    svc.close()


def entries(r, model):
    return [msgpack.unpackb(f[b"data"]) for _, f in r.xrange(ModelKeys(model).input)]


def test_each_request_goes_to_the_model_of_its_user(service, redis_server):
    from streamnb_workers.protocols.mail_service import LearnRefused
    from streamnb_workers.replication.user_sum import create_user_model
    from streamnb_workers.store.model_config import ModelSpec, ensure_config

    r = redis_server.client()
    ensure_config(r, ModelSpec("mail", kind="multinomial", featurizer_config={"bits": 8}))
    m = mail("spam", 1)
    assert not service.check(m, "Alice <alice@example.org>").scored  # no worker: timeout
    # learning registers her model and waits for a --per-user worker to create it: none here
    with pytest.raises(LearnRefused, match="--per-user"):
        service.learn(m, "spam", "alice@example.org")
    assert entries(r, "mail.u.alice_40example.org") == []
    create_user_model(r, "mail", "mail.u.alice_40example.org")  # what the worker does
    service.learn(m, "spam", "alice@example.org")
    assert not service.check(m, "Alice <alice@example.org>").scored
    assert not service.check(m, "root").scored
    # several recipients (Rspamd's Rcpt headers): the model they share, else the global one
    assert not service.check(m, None, ["alice@example.org", "<alice@example.org>"]).scored
    assert not service.check(m, "alice@example.org", ["alice@example.org", "b@example.org"]).scored
    alice, default = entries(r, "mail.u.alice_40example.org"), entries(r, "mail")
    assert [e.get("label") for e in alice] == ["spam", None, None]
    assert [e.get("label") for e in default] == [None, None, None]
    assert alice[0]["id"].startswith("spamd:") and alice[1]["id"].startswith("spamd-")
    assert service.forget(m, "alice@example.org") is False  # not learnt: nothing sent


def test_a_label_the_model_does_not_declare_or_not_mail_is_refused(service, redis_server):
    from streamnb_workers.protocols.mail_service import LearnRefused
    from streamnb_workers.store.model_config import ModelSpec, ensure_config

    r = redis_server.client()
    ensure_config(r, ModelSpec("mail", kind="multinomial", classes=["junk", "good"]))
    with pytest.raises(LearnRefused, match="not one of model 'mail'"):
        service.learn(mail("spam", 2), "spam")
    with pytest.raises(LearnRefused):
        service.learn(b"\x00\x01 not mail", "junk")
    assert r.xlen(ModelKeys("mail").input) == 0
