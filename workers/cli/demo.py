"""The demo (``streamnb demo``): real mail through two workers, in under a minute, with
nothing installed.

It replays the shipped sample of the SpamAssassin public corpus (``streamnb/data/``, see its
NOTICE) in date order, every message labelled, through two workers of one consumer group,
test-then-train: each message is predicted by the model as it was *before* learning it, so
the accuracy printed is the online (prequential) accuracy a mail pipeline would have seen.

Redis: ``--redis URL`` if given, else the embedded default (:mod:`streamnb_workers.store.embedded`): a
private ``redis-server`` on a free port, or in-process fakeredis. The two workers run as
threads of this process, each with its own Prometheus registry served on its own port.

>>> sample = load_sample(limit=3)
>>> [(m.path.split("/")[0], m.label) for m in sample][:1], len(sample)
([('spam-1', 'spam')], 3)
"""

from __future__ import annotations

import csv
import email
import email.policy
import io
import sys
import tarfile
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from streamnb.exceptions import SettingsError
from streamnb_workers.cli.supervisor import serve_metrics
from streamnb_workers.client.sources import Outgoing
from streamnb_workers.exit_codes import EXIT_FAILURE
from streamnb_workers.store.connection import UrlConnector
from streamnb_workers.store.embedded import free_port, start_embedded
from streamnb_workers.store.keys import GROUP, ModelKeys, check_model_name
from streamnb_workers.store.model_config import ModelSpec
from streamnb_workers.store.redaction import redact_url
from streamnb_workers.wire.codec import DATA_FIELD, decode_input, encode_input
from streamnb_workers.wire.outputs import decode_output
from streamnb_workers.wire.replies import as_str, entry_field

__all__ = ["SAMPLE_NAME", "SampleMessage", "build_sample", "load_sample", "run_demo"]

SAMPLE_NAME = "spamassassin-sample.tar.xz"
#: The demo stops waiting for the workers after this many seconds.
DEMO_TIMEOUT_S = 50.0


@dataclass(frozen=True, slots=True)
class SampleMessage:
    path: str
    label: str
    ts: float
    raw: bytes


# ------------------------------------------------------------------------------ sample
def build_sample(corpus_dir: str | Path, out: str | Path, n: int = 600) -> dict[str, int]:
    """Write the demo sample: every (len(index)/n)-th message of ``corpus_dir/index.tsv``
    in index order (so the spam/ham ratio is the corpus's) into an xz tar with its own
    index.tsv. Returns the label counts."""
    root = Path(corpus_dir)
    with (root / "index.tsv").open(newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))[1:]
    pick = [rows[(k * len(rows)) // n] for k in range(min(n, len(rows)))]
    counts: dict[str, int] = {}
    with tarfile.open(out, "w:xz", preset=9) as tar:
        index = "path\tlabel\tunix_time\n" + "".join("\t".join(r[:3]) + "\n" for r in pick)

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))

        add("index.tsv", index.encode())
        for r in pick:
            add(r[0], (root / r[0]).read_bytes())
            counts[r[1]] = counts.get(r[1], 0) + 1
    return counts


def load_sample(limit: int | None = None, path: str | Path | None = None) -> list[SampleMessage]:
    """The shipped sample's messages in index (date) order; members are read into memory,
    never extracted to disk."""
    src = Path(path) if path else resources.files("streamnb").joinpath("data", SAMPLE_NAME)
    with resources.as_file(src) if not isinstance(src, Path) else _nullctx(src) as p, \
            tarfile.open(p, "r:xz") as tar:
        index_file = tar.extractfile("index.tsv")
        if index_file is None:
            raise SettingsError(f"{p}: no index.tsv in the sample")
        rows = list(csv.reader(io.TextIOWrapper(index_file, encoding="utf-8"), delimiter="\t"))[1:]
        if limit is not None:
            rows = rows[:limit]
        out = []
        for r in rows:
            member = tar.extractfile(r[0])
            if member is None:
                raise SettingsError(f"{p}: {r[0]} is listed in index.tsv but missing")
            out.append(SampleMessage(r[0], r[1], float(r[2]), member.read()))
    return out


class _nullctx:
    def __init__(self, value: Any) -> None:
        self.value = value

    def __enter__(self) -> Any:
        return self.value

    def __exit__(self, *exc: object) -> None:
        return None


# ------------------------------------------------------------------------------ running
class Tally:
    """Reads ``:out`` incrementally and keeps the online accuracy."""

    def __init__(self, client: Any, out_key: str) -> None:
        self.client = client
        self.key = out_key
        self.last = "0-0"
        self.seen: dict[str, dict[str, Any]] = {}
        self.by_worker: dict[str, int] = {}

    def poll(self) -> None:
        while True:
            entries = self.client.xrange(self.key, min=f"({self.last}", max="+", count=500)
            for entry_id, fields in entries:
                self.last = as_str(entry_id)
                out = decode_output(entry_field(fields, DATA_FIELD))
                if out["id"] not in self.seen:  # at-least-once: keep the first prediction
                    self.seen[out["id"]] = out
                    w = str(out.get("worker"))
                    self.by_worker[w] = self.by_worker.get(w, 0) + 1
            if len(entries) < 500:
                return

    def accuracy(self, ids: list[str] | None = None) -> tuple[int, int]:
        outs = [self.seen[i] for i in ids if i in self.seen] if ids is not None else list(self.seen.values())
        right = sum(1 for o in outs if o.get("label") == o.get("true_label"))
        return right, len(outs)


def _subject(raw: bytes) -> str:
    try:
        msg = email.message_from_bytes(raw, policy=email.policy.default)
        subject = str(msg.get("subject", "") or "")
    except Exception:  # noqa: BLE001 - a broken header just shows no subject
        subject = ""
    subject = " ".join(subject.split())
    return (subject[:57] + "...") if len(subject) > 60 else subject


def _pct(right: int, n: int) -> str:
    return f"{100.0 * right / n:5.1f}%" if n else "  n/a"


def _await_consumers(client: Any, keys: Any, names: list[str], timeout: float = 10.0) -> None:
    """Wait (at most ``timeout`` s) until every worker has read from the input stream once
    (it is then a consumer of the group), so that the messages produced next are shared
    between them rather than taken by whichever worker started first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        joined = {as_str(c["name"]) for c in client.xinfo_consumers(keys.input, GROUP)}
        if joined >= set(names):
            return
        time.sleep(0.02)


def run_demo(
    settings: Any = None,
    *,
    messages: int = 600,
    model: str = "demo",
    metrics_port: int = 0,
    metrics_addr: str = "127.0.0.1",
    out: TextIO | None = None,
    timeout: float = DEMO_TIMEOUT_S,
    embedded: str = "auto",
) -> int:
    """Run the demo (see the module docstring); returns the exit code."""
    # deferred: the worker, its metrics and the model's top tokens load only for the demo
    from prometheus_client import CollectorRegistry

    from streamnb_workers.client.offline_predict import top_tokens  # deferred, as above
    from streamnb_workers.observe.metrics import Metrics  # deferred, as above
    from streamnb_workers.worker import Worker, WorkerOptions  # deferred, as above

    out = out or sys.stdout
    tty = out.isatty()
    t0 = time.monotonic()
    try:
        check_model_name(model)
    except ValueError as exc:
        raise SettingsError(f"--model: {exc}") from None
    sample = load_sample(limit=messages)
    n = len(sample)
    n_spam = sum(1 for m in sample if m.label == "spam")
    print(f"streamnb demo: {n} messages of the SpamAssassin public corpus ({n_spam} spam, "
          f"{n - n_spam} ham), in date order, every one labelled (test-then-train)", file=out)

    if settings is None:
        embedded = start_embedded(embedded)
        make_connector = embedded.connector
        client = embedded.make_client()
        where = embedded.describe()
    else:
        client = settings.make_client()
        client.ping()

        def make_connector() -> Any:
            return UrlConnector(settings)


        where = redact_url(settings.url)
    keys = ModelKeys(model)
    try:
        if any(client.exists(k) for k in (keys.config, keys.input, keys.log)):
            raise SettingsError(
                f"model {model!r} already has data on {where}; pick another name with --model")
        print(f"redis:   {where}", file=out)

        spec = ModelSpec(model, kind="multinomial")
        workers: list[Worker] = []
        urls: list[str] = []
        for i in range(2):
            registry = CollectorRegistry()
            port = metrics_port + i if metrics_port else free_port(metrics_addr)
            serve_metrics(port, metrics_addr, registry)
            urls.append(f"http://{metrics_addr}:{port}/metrics")
            options = WorkerOptions(consumer=f"demo-worker-{i}", batch=20, block_ms=100,
                                    heartbeat_s=1.0)
            workers.append(Worker(make_connector(), [spec], options, Metrics(registry)))
        workers[0].start()  # creates the config and the group before the second joins
        threads = [threading.Thread(target=w.run, kwargs={"install_signals": False},
                                    name=w.consumer, daemon=True) for w in workers]
        for t in threads:
            t.start()
        _await_consumers(client, keys, [w.consumer for w in workers])
        print(f"workers: {', '.join(w.consumer for w in workers)} (metrics: {', '.join(urls)})",
              file=out)

        ids = []
        pipe = client.pipeline(transaction=False)
        for m in sample:
            msg = Outgoing(id=m.path, raw=m.raw)
            pipe.xadd(keys.input, {DATA_FIELD: msg.encode(label=m.label, ts=m.ts)})
            ids.append(m.path)
        pipe.execute()

        tally = Tally(client, keys.out)
        next_line = 0.0
        deadline = time.monotonic() + timeout
        while True:
            tally.poll()
            done = len(tally.seen)
            right, total = tally.accuracy()
            now = time.monotonic()
            if tty:
                out.write(f"\r  predicted {done:4d}/{n}  online accuracy {_pct(right, total)}  "
                          + "  ".join(f"{w}: {c}" for w, c in sorted(tally.by_worker.items())))
                out.flush()
            elif now >= next_line or done >= n:
                print(f"  predicted {done:4d}/{n}  online accuracy {_pct(right, total)}", file=out)
                next_line = now + 2.0
            if done >= n or now > deadline:
                break
            time.sleep(0.2)
        if tty:
            out.write("\n")
        for w in workers:
            w.request_stop()
        for t in threads:
            t.join(10)
        if len(tally.seen) < n:
            print(f"streamnb demo: only {len(tally.seen)} of {n} messages predicted within "
                  f"{timeout:.0f} s", file=out)
            return EXIT_FAILURE

        # ------------------------------------------------------------------ report
        right, total = tally.accuracy()
        half = ids[n // 2:]
        r2, n2 = tally.accuracy(half)
        spam_ids = [m.path for m in sample if m.label == "spam"]
        ham_ids = [m.path for m in sample if m.label == "ham"]
        caught = sum(1 for i in spam_ids if tally.seen[i].get("label") == "spam")
        kept = sum(1 for i in ham_ids if tally.seen[i].get("label") == "ham")
        lost = sum(1 for i in ham_ids if tally.seen[i].get("label") == "spam")
        blind = sum(1 for o in tally.seen.values() if o.get("label") is None)
        versions = {w.models[model].replica.version for w in workers}
        learnt = workers[0].models[model].replica.model.stats["classes"]
        elapsed = time.monotonic() - t0
        print(f"\nonline accuracy: {_pct(right, total).strip()} of {total} "
              f"(second half: {_pct(r2, n2).strip()} of {n2})", file=out)
        print(f"spam caught {caught}/{len(spam_ids)}, ham recognised {kept}/{len(ham_ids)} "
              f"({lost} ham marked as spam); {blind} predicted before the model had learnt "
              f"anything (counted as errors)", file=out)
        print("predictions by worker: "
              + ", ".join(f"{w.consumer} {tally.by_worker.get(w.consumer, 0)}" for w in workers),
              file=out)
        same = "the same version" if len(versions) == 1 else f"versions {sorted(versions)}"
        n_learnt = sum(1 for o in tally.seen.values() if o.get("learned"))
        # a message learnt after a wrong verdict weighs more (the error weight)
        print(f"learnt: {n_learnt} messages, weight {learnt.total:g} "
              f"({', '.join(f'{k} {v:g}' for k, v in learnt.as_dict().items())}); "
              f"both workers at {same}", file=out)

        rt = workers[0].models[model]
        final = rt.replica.model
        print("\na few predictions (label at arrival, P(spam) at arrival, tokens that weigh most "
              "for the final model):", file=out)
        shown = [m for m in sample[-80:] if m.label == "spam"][-3:] + \
                [m for m in sample[-80:] if m.label == "ham"][-2:]

        for m in shown:
            o = tally.seen[m.path]
            p_spam = o.get("log_proba", {}).get("spam")
            p = f"{__import__('math').exp(p_spam):.3f}" if p_spam is not None else "n/a"
            msg = decode_input(encode_input("raw", m.raw, id=m.path), m.path)
            toks = [t for t, _ in top_tokens(final, rt.featurizer, msg, o.get("label"), k=4)]
            print(f"  [{m.label:>4} -> {o.get('label')!s:>4}  P(spam)={p}] {_subject(m.raw)!r}",
                  file=out)
            if toks:
                print(f"        tokens: {'  '.join(toks)}", file=out)
        print(f"\nmetrics were served at {', '.join(urls)}", file=out)
        print(f"done in {elapsed:.1f} s. Run your own: streamnb worker --redis URL --model mail "
              f"--kind multinomial, then streamnb produce --redis URL --model mail --label spam DIR",
              file=out)
        return 0
    except SettingsError:
        raise
    except KeyboardInterrupt:
        return 130
    finally:
        if settings is None:
            embedded.close()
