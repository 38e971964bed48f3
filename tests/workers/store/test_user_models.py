"""Per-user model names: valid model names, one-to-one over addresses (in lower case),
user and domain names apart, long addresses hashed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamnb_workers.store.keys import check_model_name
from streamnb_workers.store.user_models import UserNames, escape_part

NAMES = UserNames("mail")
PARTS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)


@given(PARTS, PARTS, PARTS, PARTS)
def test_two_addresses_share_a_model_only_when_equal_in_lower_case(l1, d1, l2, d2):
    a, b = f"{l1}@{d1}", f"{l2}@{d2}"
    for address in (a, b):
        check_model_name(NAMES.user(address))
    assert (NAMES.user(a) == NAMES.user(b)) == (a.lower() == b.lower())
    assert NAMES.user(a) != NAMES.domain(d2)


@pytest.mark.parametrize(("local", "domain"), [
    ("x.at.y", "z"), ("x", "y.at.z"), ("a_40b", "c"), ("a", "b_40c"), ("a@b", "c"),
])
def test_separators_inside_the_parts_do_not_collide(local, domain):
    others = [("x.at.y", "z"), ("x", "y.at.z"), ("a_40b", "c"), ("a", "b_40c"), ("a@b", "c")]
    names = {NAMES.user(f"{lo}@{do}") for lo, do in others}
    assert len(names) == len(others)
    assert NAMES.user(f"{local}@{domain}") in names


def test_escaping_and_the_hash_of_a_long_address():
    assert escape_part("Ünï_+") == "_c3_bcn_c3_af_5f_2b"
    long = "x" * 64 + "@" + "d" * 60 + ".org"
    name = NAMES.user(long)
    assert name.startswith("mail.uh.") and len(name) == len("mail.uh.") + 32
    assert name == NAMES.user(long.upper()) != NAMES.user(long + "g")


def test_a_template_or_a_model_that_cannot_name_models_is_refused():
    with pytest.raises(ValueError, match="template"):
        UserNames("mail", user_template="{model}|{local}@{domain}")
    with pytest.raises(ValueError, match="template"):
        UserNames("mail", domain_template="{model}.{nope}")
    with pytest.raises(ValueError, match="too long"):
        UserNames("m" * 70)


@pytest.mark.redis
def test_the_registry_bound_lets_racing_registrations_take_the_last_places_once(redis_server):
    """Eight threads register 50 names each against a bound of 100 on a real redis-server:
    exactly 100 are taken, each answered new once, every other refused; a registered name
    is known, not refused, past the bound."""
    import threading

    from streamnb_workers.store.user_models import register, registry_key, user_models

    answers: list[list] = [[] for _ in range(8)]

    def go(i: int) -> None:
        client = redis_server.client()
        answers[i] = [register(client, "mail", f"mail.u.t{i}_{j}", limit=100) for j in range(50)]

    threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [a for part in answers for a in part]
    r = redis_server.client()
    assert flat.count(True) == 100 and flat.count(None) == 300 and r.scard(registry_key("mail")) == 100
    taken = user_models(r, "mail")
    assert register(r, "mail", taken[0], limit=100) is False
    assert register(r, "mail", "mail.u.late", limit=100) is None
    assert register(r, "mail", "mail.u.late") is True  # no bound
