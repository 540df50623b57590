"""The one error data preparation reports: a problem with the raw data, the options or the tools.

Every preparation command catches it at its top and prints its message alone, without a
traceback (``cli.report_errors``), so that a missing raw file or a wrong encoding reads as
one line that says what to do.
"""


class PrepError(Exception):
    """A problem with the raw data or the tools; reported as one message."""
