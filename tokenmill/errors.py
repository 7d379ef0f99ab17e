"""Errors a user can cause. The CLI prints them as one line, never a traceback."""


class UserError(Exception):
    """A problem with the user's input, config or environment, said in one line."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, as ``timeout``, ``scancel`` and Kubernetes send it to the whole process group: a
    run ends as on Ctrl-C (the previous output kept, the workers ended) and says so."""


def first_line(e: BaseException, limit: int | None = 200) -> str:
    """The first line of an exception's text (its type's name when it has none), for the one
    line a library's error becomes."""
    text = str(e).strip()
    line = text.splitlines()[0] if text else type(e).__name__
    return line[:limit] if limit else line
