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
