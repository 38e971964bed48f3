"""The stored model config (workers/store/model_config.py)."""

from __future__ import annotations


def test_read_config_reads_every_field_a_config_stores():
    """read_config uses HMGET of CONFIG_FIELDS (a scorer's right): they are to_hash's."""
    from streamnb_workers.store.model_config import CONFIG_FIELDS, ModelConfig

    assert tuple(ModelConfig("m", "multinomial", {}, {}).to_hash()) == CONFIG_FIELDS
