"""Errors a user can cause. The CLI prints them as one line, never a traceback."""


class UserError(Exception):
    """A problem with the user's input, config or environment, said in one line."""
