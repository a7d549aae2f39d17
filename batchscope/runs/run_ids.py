"""The one format of names that become folders and labels: a load run's --run-id, a plan's and a setting's name.

Letters, digits, '.', '_' and '-', starting with a letter or digit, so a name is a safe folder name and a
bounded Prometheus label value. A load run's id is at most RUN_ID_MAX_LENGTH characters and defaults to its
start time.
"""

from __future__ import annotations

import re
import time

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]*"
RUN_ID_MAX_LENGTH = 128
# a name (the lookahead) of 1 to RUN_ID_MAX_LENGTH characters; use with fullmatch
RUN_ID = re.compile(rf"(?={NAME_PATTERN}$).{{1,{RUN_ID_MAX_LENGTH}}}")


def default_run_id() -> str:
    """The run's start time, local, to the second (20261130T224700)."""
    return time.strftime("%Y%m%dT%H%M%S")
