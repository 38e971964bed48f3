"""``python -m streamnb_workers.worker``: a bare worker for tests and debugging (the
supported command is ``streamnb worker``). Specs and options are JSON."""

from __future__ import annotations

import argparse
import json
import logging

from prometheus_client import start_http_server

from streamnb_workers.store.connection import RedisSettings, UrlConnector
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.worker import Worker, WorkerOptions, tune_gc


def main(argv: list[str] | None = None) -> int:
    """``python -m streamnb_workers.worker``: a bare worker for tests and debugging (the
    supported command is ``streamnb worker``). Specs and options are JSON."""
    p = argparse.ArgumentParser(prog="python -m streamnb_workers.worker")
    p.add_argument("--redis", required=True)
    p.add_argument("--spec", action="append", default=[],
                   help='JSON ModelSpec, e.g. {"name": "mail", "kind": "multinomial"}')
    p.add_argument("--specs-file", help="a JSON list of ModelSpecs (many models)")
    p.add_argument("--options", default="{}", help="JSON WorkerOptions fields")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve Prometheus metrics on 127.0.0.1:PORT (0: none)")
    p.add_argument("--cluster", action="store_true", help="--redis is a Redis Cluster node")
    a = p.parse_args(argv)
    if a.metrics_port:
        start_http_server(a.metrics_port, addr="127.0.0.1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    specs = [ModelSpec(**json.loads(s)) for s in a.spec]
    if a.specs_file:
        with open(a.specs_file, encoding="utf-8") as fh:
            specs += [ModelSpec(**s) for s in json.load(fh)]
    if not specs:
        p.error("give --spec or --specs-file")
    worker = Worker(UrlConnector(RedisSettings(a.redis, cluster=a.cluster)), specs,
                    WorkerOptions(**json.loads(a.options)))
    tune_gc()
    return worker.run()


if __name__ == "__main__":
    raise SystemExit(main())
