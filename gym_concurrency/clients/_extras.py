"""The error for an optional client library that is missing or too old: it names the library,
what needs it and the extra that brings it, where Python would say only "No module named"."""

from __future__ import annotations

__all__ = ["missing_library"]


def missing_library(error: ImportError, library: str, needed_by: str, minimum: str) -> ImportError:
    """An ImportError for `library` (>= `minimum`), needed by `needed_by`, with how to get it;
    `error` itself if it is about something else (raise it `from error`)."""
    if isinstance(error, ModuleNotFoundError) and error.name != library:
        return error  # a dependency of the library is missing: its own message says which
    absent = isinstance(error, ModuleNotFoundError)
    found = "is not installed" if absent else f"is too old ({error})"
    return ImportError(
        f"{needed_by} needs {library} >= {minimum}, which {found}: "
        f"pip install 'gym-concurrency[{library}]' (or '.[{library}]' from a checkout), "
        f"or pip install '{library}>={minimum}'"
    )
