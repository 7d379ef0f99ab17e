"""Store credentials: where they come from, and never shown.

They come from the usual places: the AWS environment variables (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ...), ``~/.aws``, or Beam's ``--s3_*`` flags, which ``absorb_flags``
moves into this process's environment so that every local worker inherits them (a remote
runner's workers get them through the job, as Beam sends every option). No key or token reaches
an error line or a log line: both pass through ``redact``.
"""

from __future__ import annotations

import os
import re

# Beam's flag -> the environment variable boto3 reads. The secret ones are never printed.
FLAG_ENV = {"s3_access_key_id": "AWS_ACCESS_KEY_ID", "s3_secret_access_key": "AWS_SECRET_ACCESS_KEY",
            "s3_session_token": "AWS_SESSION_TOKEN", "s3_endpoint_url": "AWS_ENDPOINT_URL",
            "s3_region_name": "AWS_REGION"}
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "GOOGLE_OAUTH_ACCESS_TOKEN")


def absorb_flags(beam_args: list[str], keep: bool) -> list[str]:
    """Beam's ``--s3_*`` flags into this process's environment (boto3 reads it; local workers
    inherit it), returned without them unless ``keep`` (a remote runner's workers need them in
    the job's options). Must run before any worker process starts."""
    rest = []
    it = iter(range(len(beam_args)))
    for i in it:
        arg = beam_args[i]
        name, eq, value = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if name in FLAG_ENV:
            if not eq and i + 1 < len(beam_args):
                value = beam_args[i + 1]
                next(it, None)
                if keep:
                    rest += [arg, value]
            elif keep:
                rest.append(arg)
            os.environ[FLAG_ENV[name]] = value
            continue
        rest.append(arg)
    return rest


# Runners whose workers are this machine's processes, started by this one (they inherit its
# environment): Beam's --s3_* flags reach them through it, never through a command line. ("": no
# --runner, Beam's default.) The one list: pipelines/launch.py uses it too, without Beam here.
LOCAL_RUNNERS = frozenset({"", "DirectRunner", "FnApiRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner",
                           "PrismRunner"})


def store_flags(args: list[str], beam: bool = True) -> list[str]:
    """A verb's extra arguments with Beam's --s3_* flags taken into the environment
    (absorb_flags): kept in the job's options only for a remote runner's job (``beam``)."""
    runner = ""
    for i, a in enumerate(args):
        if a.startswith("--runner="):
            runner = a.split("=", 1)[1]
        elif a == "--runner" and i + 1 < len(args):
            runner = args[i + 1]
    return absorb_flags(args, keep=beam and runner.rsplit(".", 1)[-1] not in LOCAL_RUNNERS)


def secrets() -> list[str]:
    """Every secret this process knows of, longest first (a key inside another is still hidden)."""
    found = {os.environ.get(k, "") for k in SECRET_ENV}
    return sorted((s for s in found if len(s) >= 4), key=len, reverse=True)


def redact(text: str) -> str:
    for s in secrets():
        text = text.replace(s, "***")
    return text


def describe(e: BaseException) -> str:
    """A store error in one line: the service's code and message, no request ids or secrets."""
    response = getattr(e, "response", None)
    if isinstance(response, dict) and isinstance(response.get("Error"), dict):
        err = response["Error"]
        text = f"{err.get('Code', type(e).__name__)}: {err.get('Message', '')}".rstrip(": ")
    else:
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return redact(re.sub(r"\s+", " ", text))[:300]
