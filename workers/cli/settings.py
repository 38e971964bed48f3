"""Where each setting comes from: flags > environment variables > TOML file > defaults.

Every flag ``--foo-bar`` of every command can also come from the environment variable
``STREAMNB_FOO_BAR`` or from the key ``foo-bar`` (or ``foo_bar``) of an optional TOML file
given by ``--config FILE`` / ``STREAMNB_CONFIG``. In the file, top-level keys apply to every
command and a ``[worker]`` (``[produce]``, ...) table to one command only, overriding the
top level. See docs/configuration.md.

Options are declared with :func:`add_option`, which keeps the real default aside and gives
argparse ``SUPPRESS``, so :func:`resolve` can tell a flag given on the command line from one
left out.

Secrets: the Redis password comes from ``--redis-password-file``, the URL
(``redis://user:password@host``) or ``STREAMNB_REDIS_PASSWORD``, in that order. It is never
printed: :func:`~streamnb_workers.store.redaction.redact` and the log filter of
:func:`setup_logging` replace it (and the password part of any URL) by ``***``.

>>> import argparse
>>> p = argparse.ArgumentParser(prog="demo")
>>> _ = add_option(p, "--batch", type=int, default=100, help="batch size")
>>> ns = resolve(p, p.parse_args([]), "worker", env={"STREAMNB_BATCH": "7"})
>>> ns.batch
7
>>> resolve(p, p.parse_args(["--batch", "3"]), "worker", env={"STREAMNB_BATCH": "7"}).batch
3
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from streamnb.exceptions import SettingsError
from streamnb_workers.store.connection import RedisSettings
from streamnb_workers.store.redaction import RedactingFilter, redact_url, register_secret

__all__ = [
    "ENV_PREFIX",
    "add_option",
    "env_name",
    "load_toml",
    "redis_settings",
    "resolve",
    "setup_logging",
]

ENV_PREFIX = "STREAMNB_"
#: Extra environment names accepted for a setting (the issue documents STREAMNB_REDIS_URL).
ENV_ALIASES = {"redis": ("STREAMNB_REDIS_URL",)}
#: Settings that name the config file itself, or are secrets, never read from TOML.
NOT_IN_FILE = frozenset({"config", "redis_password_file"})
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}
_DEFAULT_ATTR = "streamnb_default"


def env_name(dest: str) -> str:
    """``"metrics_port"`` -> ``"STREAMNB_METRICS_PORT"``."""
    return ENV_PREFIX + dest.upper()


def add_option(parser: argparse.ArgumentParser, *flags: str, default: Any = None, **kw: Any) -> argparse.Action:
    """``parser.add_argument`` for an option that may also come from env or TOML.

    The help text gets ``(default: X; env STREAMNB_FOO)`` appended.
    """
    action = parser.add_argument(*flags, default=argparse.SUPPRESS, **kw)
    setattr(action, _DEFAULT_ATTR, default)
    if action.help is not argparse.SUPPRESS:
        extra = f"env {env_name(action.dest)}"
        if default not in (None, False, []):
            extra = f"default: {default}; {extra}"
        action.help = f"{action.help or ''} ({extra})".strip()
    return action


def _declared(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """dest -> action of every option declared with :func:`add_option` (groups included)."""
    return {a.dest: a for a in parser._actions if hasattr(a, _DEFAULT_ATTR)}


def option_dests(parser: argparse.ArgumentParser) -> set[str]:
    """Every setting declared with :func:`add_option` on ``parser``."""
    return set(_declared(parser))


# ----------------------------------------------------------------------------- TOML
def load_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a TOML config file; any problem is a one-line :class:`SettingsError`."""
    p = Path(path)
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise SettingsError(f"config file {str(p)!r} does not exist") from None
    except PermissionError:
        raise SettingsError(f"config file {str(p)!r} is not readable (permission denied)") from None
    except IsADirectoryError:
        raise SettingsError(f"config file {str(p)!r} is a directory, expected a TOML file") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {str(p)!r} is not valid TOML: {exc}") from None
    except OSError as exc:
        raise SettingsError(f"config file {str(p)!r} cannot be read: {exc.strerror}") from None


def _file_values(
    data: Mapping[str, Any], command: str, known: set[str], all_known: set[str],
    commands: set[str], path: str,
) -> dict[str, Any]:
    """Flatten the TOML data for ``command``: top level, then its own table."""
    out: dict[str, Any] = {}

    def take(table: Mapping[str, Any], where: str, strict: bool) -> None:
        for key, value in table.items():
            if isinstance(value, dict) and where == "top level" and key in commands:
                continue
            dest = key.replace("-", "_")
            if dest in NOT_IN_FILE:
                raise SettingsError(f"{path}: {key!r} cannot be set in the config file")
            if dest in known:
                out[dest] = value
            elif strict or dest not in all_known:
                raise SettingsError(
                    f"{path}: unknown setting {key!r} in the {where}"
                    f" (known: {', '.join(sorted(k.replace('_', '-') for k in known))})"
                )

    take(data, "top level", strict=False)
    section = data.get(command)
    if section is not None:
        if not isinstance(section, dict):
            raise SettingsError(f"{path}: [{command}] must be a table")
        take(section, f"[{command}] table", strict=True)
    return out


# ------------------------------------------------------------------------ conversion
def _convert(action: argparse.Action, value: Any, source: str) -> Any:
    """Convert an env string or TOML value with the action's own rules."""
    name = action.option_strings[-1]
    if isinstance(action, argparse.BooleanOptionalAction):  # --foo / --no-foo
        name = action.option_strings[0]
    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction,
                           argparse.BooleanOptionalAction)):
        if isinstance(value, bool):
            v = value
        elif isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            v = value.strip().lower() in _TRUE
        else:
            raise SettingsError(f"{source}: {name} expects true or false, got {value!r}")
        return not v if isinstance(action, argparse._StoreFalseAction) else v
    if isinstance(action, argparse._AppendAction):
        if isinstance(value, str):
            items: list[Any] = [s.strip() for s in value.split(",") if s.strip()]
        elif isinstance(value, list):
            items = value
        else:
            items = [value]
        return [_convert_one(action, name, item, source) for item in items]
    return _convert_one(action, name, value, source)


def _convert_one(action: argparse.Action, name: str, value: Any, source: str) -> Any:
    if isinstance(value, list) and len(value) == 1:  # e.g. a shared `model = ["mail"]`
        value = value[0]
    if isinstance(value, (dict, list)):
        raise SettingsError(f"{source}: {name} expects a single value, got {value!r}")
    text = str(value).lower() if isinstance(value, bool) else str(value)
    try:
        converted = action.type(text) if action.type else text
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise SettingsError(f"{source}: invalid value {value!r} for {name}: {exc}") from None
    if action.choices is not None and converted not in action.choices:
        choices = ", ".join(map(str, action.choices))
        raise SettingsError(f"{source}: {name} must be one of {choices}, got {value!r}")
    return converted


def resolve(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    command: str,
    env: Mapping[str, str] | None = None,
    all_parsers: Mapping[str, argparse.ArgumentParser] | None = None,
) -> argparse.Namespace:
    """Fill every option not given on the command line from env, then TOML, then defaults.

    ``all_parsers`` (command -> parser) lets a shared TOML file hold keys of other commands
    at its top level without being an error here.
    """
    env = os.environ if env is None else env
    actions = _declared(parser)
    defaults = {dest: getattr(a, _DEFAULT_ATTR) for dest, a in actions.items()}
    given = set(vars(args))

    file_values: dict[str, Any] = {}
    config = getattr(args, "config", None)
    if config is None:
        config = env.get(env_name("config")) or None
        if hasattr(args, "config"):
            args.config = config
    if config:
        all_known = set(defaults)
        for p in (all_parsers or {}).values():
            all_known |= option_dests(p)
        file_values = _file_values(load_toml(config), command, set(defaults), all_known,
                                   set(all_parsers or {}) | {command}, str(config))

    for dest, action in actions.items():
        if dest in given:
            continue
        names = (env_name(dest), *ENV_ALIASES.get(dest, ()))
        env_hit = next((n for n in names if env.get(n) not in (None, "")), None)
        if env_hit is not None:
            value = _convert(action, env[env_hit], f"environment variable {env_hit}")
        elif dest in file_values:
            value = _convert(action, file_values[dest], f"config file {config}")
        else:
            value = defaults[dest]
            if isinstance(value, list):
                value = list(value)
        setattr(args, dest, value)
    return args


# --------------------------------------------------------------------- Redis target
_SCHEMES = ("redis", "rediss", "unix")


def redis_settings(
    url: str | None,
    *,
    password_file: str | None = None,
    tls_ca_file: str | None = None,
    tls_cert_file: str | None = None,
    tls_key_file: str | None = None,
    cluster: bool = False,
    client_name: str | None = None,
    env: Mapping[str, str] | None = None,
) -> RedisSettings:
    """Validate a Redis URL, gather its credentials, and register the password for redaction.

    The password comes from ``password_file``, else the URL, else ``STREAMNB_REDIS_PASSWORD``.

    >>> s = redis_settings("rediss://bob:pa%40ss@db.example:6380/2", env={})
    >>> s.username, s.password, redact_url(s.url)
    ('bob', 'pa@ss', 'rediss://bob:***@db.example:6380/2')
    >>> redis_settings("http://x", env={})
    Traceback (most recent call last):
    ...
    streamnb.exceptions.SettingsError: --redis expects a redis://, rediss:// or unix:// URL, got 'http://x'
    """
    env = os.environ if env is None else env
    if not url:
        raise SettingsError("no Redis URL: give --redis URL or set STREAMNB_REDIS_URL")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError as exc:
        raise SettingsError(f"--redis: bad URL {redact_url(url)!r}: {exc}") from None
    if parts.scheme not in _SCHEMES:
        raise SettingsError(
            f"--redis expects a redis://, rediss:// or unix:// URL, got {redact_url(url)!r}")
    if parts.scheme != "unix":
        if not parts.hostname:
            raise SettingsError(f"--redis: URL {redact_url(url)!r} has no host")
        db = parts.path.lstrip("/")
        if db and not db.isdigit():
            raise SettingsError(
                f"--redis: the database in {redact_url(url)!r} must be a number, got {db!r}")
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password is not None else None
    if password is not None:
        register_secret(password)
    if password_file:
        try:
            password = Path(password_file).read_text().rstrip("\r\n")
        except OSError as exc:
            raise SettingsError(
                f"--redis-password-file {password_file!r} cannot be read: {exc.strerror}") from None
    elif password is None and env.get("STREAMNB_REDIS_PASSWORD"):
        password = env["STREAMNB_REDIS_PASSWORD"]
    for flag, path in (("--tls-ca-file", tls_ca_file), ("--tls-cert-file", tls_cert_file),
                       ("--tls-key-file", tls_key_file)):
        if path and not Path(path).is_file():
            raise SettingsError(f"{flag} {path!r} is not a readable file")
    if bool(tls_cert_file) != bool(tls_key_file):
        raise SettingsError("--tls-cert-file and --tls-key-file go together: give both")
    if password:
        register_secret(password)
    try:
        return RedisSettings(url=url, password=password, username=username, ca_file=tls_ca_file,
                             cert_file=tls_cert_file, key_file=tls_key_file, cluster=cluster,
                             client_name=client_name)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


class StderrHandler(logging.StreamHandler):
    """A handler on ``sys.stderr`` as it is when a line is written, not as it was when the
    handler was made (what replaced it since, a test's capture, may be closed by now)."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def setup_logging(level: str = "INFO") -> None:
    """Log lines ``time level name message`` to stderr, every one redacted."""
    handler = StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
