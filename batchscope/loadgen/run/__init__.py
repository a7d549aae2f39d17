"""One run's two sides: the senders (sender.py's ``LoadRun``, one per process that runs users) and the
controller (control.py's ``RunControl``, on the master or the local runner), the typed report between them
(report.py), the rate-limited log of failed requests (faults.py) and gevent helpers (greenlets.py). This face
lists what the rest of the load generator uses of it."""

from batchscope.loadgen.run.control import RunControl
from batchscope.loadgen.run.greenlets import work_when_idle
from batchscope.loadgen.run.report import WIRE_KEY, SenderReport
from batchscope.loadgen.run.sender import LoadRun

__all__ = ["WIRE_KEY", "LoadRun", "RunControl", "SenderReport", "work_when_idle"]
